"""``ResponseRecords`` as a state machine (hypothesis): stored responses put, read, deleted,
forgotten and expired in any order, with a clock that moves. Invariants after every step: no
replica holds more states than its bound; every session a record ever held is either still held
by exactly one record or was handed out for release exactly once; a tenant never reads another's
record; expired records are never read."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.control.response_records import ResponseRecords, StoredResponse

MAX_STATES, TTL, MAX_RECORDS = 2, 50.0, 6
REPLICAS, TENANTS = ("replica-0", "replica-1"), ("acme", "globex")


class Records(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.records = ResponseRecords(MAX_STATES, TTL, MAX_RECORDS, clock=lambda: self.now)
        self.made: dict[str, tuple[str, float]] = {}  # response id -> (tenant, created)
        self.sessions: set[str] = set()  # every session a record was given
        self.released: list[str] = []
        self.count = 0

    def _release(self, pairs) -> None:
        for session_id, tenant in pairs:
            assert session_id.startswith(tenant + ":"), "released under another tenant"
            self.released.append(session_id)

    @rule(tenant=st.sampled_from(TENANTS), replica=st.sampled_from(REPLICAS),
          with_state=st.booleans())  # fmt: skip
    def put(self, tenant: str, replica: str, with_state: bool) -> None:
        self.count += 1
        rid = f"resp_{self.count}"
        session = f"{tenant}:s{self.count}" if with_state else None
        if session:
            self.sessions.add(session)
        record = StoredResponse(rid, tenant, {}, [], [], [1, 2], session, replica, self.now)
        self._release(self.records.put(record))
        self.made[rid] = (tenant, self.now)

    @precondition(lambda self: self.made)
    @rule(data=st.data(), tenant=st.sampled_from(TENANTS))
    def get(self, data, tenant: str) -> None:
        rid = data.draw(st.sampled_from(sorted(self.made)))
        owner, created = self.made[rid]
        got = self.records.get(rid, tenant)
        if got is not None:
            assert got.tenant == tenant == owner
            assert self.now - created <= TTL

    @precondition(lambda self: self.made)
    @rule(data=st.data(), tenant=st.sampled_from(TENANTS))
    def delete(self, data, tenant: str) -> None:
        rid = data.draw(st.sampled_from(sorted(self.made)))
        deleted, release = self.records.delete(rid, tenant)
        self._release(release)
        if deleted:
            assert self.made[rid][0] == tenant
            assert self.records.get(rid, tenant) is None

    @precondition(lambda self: self.made)
    @rule(data=st.data())
    def forget_state(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.made)))
        record = self.records.records.get(rid)
        held = record.session_id if record else None
        self.records.forget_state(rid)
        if held:
            self.released.append(held)  # the caller found it gone: it counts as released

    @rule(seconds=st.floats(0, 40))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._release(self.records.sweep())

    @invariant()
    def bounded(self) -> None:
        held = [r.session_id for r in self.records.records.values() if r.session_id]
        for replica in REPLICAS:
            on = [r for r in self.records.records.values()
                  if r.session_id and r.replica_id == replica]  # fmt: skip
            assert len(on) <= MAX_STATES
        assert len(self.records.records) <= MAX_RECORDS
        assert len(self.released) == len(set(self.released)), "a state released twice"
        assert set(held).isdisjoint(self.released), "a released state still held"
        assert set(held) | set(self.released) == self.sessions, "a state lost track of"
        stats = self.records.stats()
        assert stats.responses == len(self.records.records)
        assert sum(stats.states.values()) == len(held) and all(stats.states.values())


TestResponseRecords = Records.TestCase
TestResponseRecords.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
