"""``ResponseRecords``: the stored responses of the front door's Responses API, and which of
them still hold a conversation state (a session).

A record keeps what ``GET /v1/responses/{id}`` returns, the conversation through it (to render
the next turn's prompt, or to replay it when its state is gone) and, while it has one, the
session holding the state at its end. States are bounded per replica (least recently used
first: an evicted record keeps its conversation and is continued by replay), records by their
age (``ttl_s``) and a total count. Methods that end states return the ``(session_id, tenant)``
pairs to release: the caller releases them. Pure, no Ray.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_RECORDS = 100_000

Release = list[tuple[str, str]]  # (session_id, tenant) of states to release


@dataclass(slots=True)
class StoredResponse:
    response_id: str
    tenant: str
    body: dict[str, Any]  # the Response object as the API returns it
    input_items: list[dict[str, Any]]  # this response's own input items
    conversation: list[dict[str, str]]  # messages through its output, instructions excluded
    state_ids: list[int] | None  # the tokens its state holds (None: unknown, replay)
    session_id: str | None  # the session holding that state (None: no state)
    replica_id: str = ""
    created: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class StoredCounts:
    responses: int  # every stored response, with a state or not
    states: dict[str, int]  # stored responses that hold a state, by replica (none: absent)


class ResponseRecords:
    def __init__(
        self,
        max_states_per_replica: int,
        ttl_s: float,
        max_records: int = MAX_RECORDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_states = max_states_per_replica
        self.ttl_s = ttl_s
        self.max_records = max_records
        self.clock = clock
        self.records: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self.states: dict[str, OrderedDict[str, None]] = {}  # replica -> ids, least recent first

    def put(self, record: StoredResponse) -> Release:
        """Store ``record`` (its id is new); returns the states this pushed out."""
        self.records[record.response_id] = record
        release = self._hold(record)
        while len(self.records) > self.max_records:
            _, oldest = self.records.popitem(last=False)
            release += self._drop_state(oldest)
        return release + self.sweep()

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The record if it exists and is ``tenant``'s; its state becomes the most recent."""
        record = self.records.get(response_id)
        if record is None or record.tenant != tenant or self._expired(record):
            return None
        held = self.states.get(record.replica_id)
        if record.session_id is not None and held is not None and response_id in held:
            held.move_to_end(response_id)
        return record

    def delete(self, response_id: str, tenant: str) -> tuple[bool, Release]:
        """Delete ``tenant``'s record; returns whether there was one and its state to release."""
        record = self.get(response_id, tenant)
        if record is None:
            return False, []
        del self.records[response_id]
        return True, self._drop_state(record)

    def forget_state(self, response_id: str) -> None:
        """The record's session is gone (released, lost): continue it by replay from now on."""
        record = self.records.get(response_id)
        if record is not None:
            self._drop_state(record)

    def sweep(self) -> Release:
        """Delete the records older than ``ttl_s``; returns their states to release."""
        release: Release = []
        while self.records:
            oldest = next(iter(self.records.values()))
            if not self._expired(oldest):
                break
            del self.records[oldest.response_id]
            release += self._drop_state(oldest)
        return release

    def ids(self, tenant: str) -> list[str]:
        """``tenant``'s stored responses, oldest first."""
        return [r.response_id for r in self.records.values() if r.tenant == tenant]

    def stats(self) -> StoredCounts:
        states = {replica: len(ids) for replica, ids in self.states.items() if ids}
        return StoredCounts(len(self.records), states)

    def _expired(self, record: StoredResponse) -> bool:
        return self.clock() - record.created > self.ttl_s

    def _hold(self, record: StoredResponse) -> Release:
        if record.session_id is None:
            return []
        held = self.states.setdefault(record.replica_id, OrderedDict())
        held[record.response_id] = None
        release: Release = []
        while len(held) > self.max_states:
            evicted_id, _ = held.popitem(last=False)
            release += self._drop_state(self.records[evicted_id])
        return release

    def _drop_state(self, record: StoredResponse) -> Release:
        held = self.states.get(record.replica_id)
        if held is not None:
            held.pop(record.response_id, None)
        if record.session_id is None:
            return []
        session_id, record.session_id = record.session_id, None
        return [(session_id, record.tenant)]
