"""The session state machine's own model of a replica's sessions, sharing no code with it.

It records every open session (resident or parked, idle or running, least recently active
first, committed and pending lengths, the values its state must hold) and, from that and the
configured sizes alone, says what must fit, which idle sessions must be parked to make room, and
what every pool (GPU and host) must count. Nothing here calls the session or pool code's own
capacity checks, LRU order or held-slot counters.

Forks share KV pages: each resident session records the (model) page of each of its page
ordinals; a fork takes its parent's whole pages and a new page for a partial last one. A page
held by several sessions is counted once (in use when a running turn holds it), and parking a
session frees only the pages that no other session holds.

Cached states (the replica's cache of states at turn boundaries) are a list, least recently used
first: each its key (the tokens folded in), its pages (the session's whole pages, a new page for
a partial last one) and the values its state holds. They live in free room only: before any
room is made (an open, a fork, a turn, a restore), entries are evicted least recently used
first until what is needed is free (or none is left); only then are sessions parked.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from replica.api import PoolStats, ReleaseReason
from replica.sessions.request import Req
from tests.support.pool_oracle import Capacity


@dataclass
class Turn:
    """A running turn as the model sees it."""

    req: Req
    target: int  # KV positions reserved for the whole turn
    produced: int  # tokens the turn can fold: pending + input, then what it generates
    marker: float | None = None  # the value its folds wrote into the live mamba state
    kv: dict[int, float] = field(default_factory=dict)  # K/V values of the positions it folded
    seq: tuple[int, ...] = ()  # the token ids it folds: pending, input, then generated ones


@dataclass
class ModelSession:
    timeout_s: float
    last: float  # clock time of its last activity (idle timeout, parking after idle)
    order: int  # when it was last active (smaller: parked first)
    committed: int = 0
    pending: int = 0
    parked: bool = False
    marker: float = 0.0  # every element of its live mamba state between turns
    kv: dict[int, float] = field(default_factory=dict)  # K/V value of each committed position
    turn: Turn | None = None
    closing: ReleaseReason | None = None  # closed during its turn: released when it ends
    pages: list[int] = field(default_factory=list)  # its GPU KV pages (model ids), in order
    tokens: tuple[int, ...] = ()  # the token ids folded into its state
    pending_ids: tuple[int, ...] = ()


@dataclass
class ModelCached:
    """A cached state as the model sees it."""

    key: tuple[int, ...]
    pages: list[int]
    marker: float
    kv: dict[int, float]


@dataclass
class SessionModel:
    cap: Capacity
    max_parked: int
    host_pages: int
    sessions: dict[str, ModelSession] = field(default_factory=dict)
    page_ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    max_cached: int = 0
    cache: list[ModelCached] = field(default_factory=list)  # least recently used first
    evictions: int = 0

    def fresh_pages(self, n: int) -> list[int]:
        return [next(self.page_ids) for _ in range(n)]

    def holders(self, page: int) -> int:
        held = sum(page in m.pages for m in self.sessions.values())
        return held + sum(page in e.pages for e in self.cache)

    def distinct(self, sessions) -> set[int]:
        return {page for m in sessions for page in m.pages}

    # ----- who is where ---------------------------------------------------------------------

    def running(self) -> list[str]:
        return sorted(s for s, m in self.sessions.items() if m.turn is not None)

    def idle(self) -> list[str]:
        return sorted(s for s, m in self.sessions.items() if m.turn is None)

    def idle_resident(self, keep: str = "") -> list[str]:
        """Idle sessions on the GPU, least recently active first: the parking order."""
        idle = [s for s in self.idle() if not self.sessions[s].parked and s != keep]
        return sorted(idle, key=lambda s: self.sessions[s].order)

    def parked(self) -> list[str]:
        return [s for s, m in self.sessions.items() if m.parked]

    # ----- room -----------------------------------------------------------------------------

    def held(self, positions: int) -> int:
        """KV token slots (whole pages) that ``positions`` positions hold."""
        return self.cap.pages(positions) * self.cap.page_size

    def gpu_free(self) -> tuple[int, int]:
        """(free session slots, free KV token slots) on the GPU."""
        rows, mamba, kv = self.free_slots()
        return min(rows, mamba // self.cap.mamba_per_session), kv

    def free_slots(self) -> tuple[int, int, int]:
        """(free req rows, free mamba slots, free KV token slots) on the GPU."""
        resident = [m for m in self.sessions.values() if not m.parked]
        pages = self.distinct(resident) | {p for e in self.cache for p in e.pages}
        rows = self.cap.max_sessions - len(resident)
        mamba = rows * self.cap.mamba_per_session - len(self.cache)
        return rows, mamba, (self.cap.kv_pages - len(pages)) * self.cap.page_size

    # ----- cached states --------------------------------------------------------------------

    def fits(self, seqs: int, kv: int, mamba: int = 0) -> bool:
        rows, free_mamba, free_kv = self.free_slots()
        need = seqs * self.cap.mamba_per_session + mamba
        return rows >= seqs and free_mamba >= need and free_kv >= kv

    def evict_until(
        self, seqs: int, kv: int, mamba: int = 0, keep: ModelCached | None = None
    ) -> bool:
        """Evict least recently used entries (never ``keep``) until the room is free."""
        for entry in list(self.cache):
            if self.fits(seqs, kv, mamba):
                return True
            if entry is not keep:
                self.evict(entry)
        return self.fits(seqs, kv, mamba)

    def evict(self, entry: ModelCached) -> None:
        self.cache.remove(entry)
        self.evictions += 1

    def keep(self, key: tuple[int, ...], pages: list[int], marker: float, kv: dict) -> None:
        """A state at a turn boundary, held in ``pages`` (the session's, in order)."""
        if not self.max_cached or not key:
            return
        for entry in self.cache:
            if entry.key == key:
                self.cache.remove(entry)
                self.cache.append(entry)
                return
        if len(self.cache) >= self.max_cached:
            self.evict(self.cache[0])
        partial = len(key) % self.cap.page_size
        if not self.evict_until(0, self.cap.page_size if partial else 0, mamba=1):
            return
        whole = len(key) // self.cap.page_size
        held = pages[:whole] + self.fresh_pages(1 if partial else 0)
        kept = {p: v for p, v in kv.items() if p < len(key)}
        self.cache.append(ModelCached(key, held, marker, kept))

    def lookup(self, prefix: tuple[int, ...]) -> ModelCached | None:
        """The entry with the longest key that begins ``prefix``, marked recently used."""
        found = [e for e in self.cache if prefix[: len(e.key)] == e.key]
        if not found:
            return None
        entry = max(found, key=lambda e: len(e.key))
        self.cache.remove(entry)
        self.cache.append(entry)
        return entry

    def host_fits(self, arriving: list[str], leaving: list[str] = ()) -> bool:
        """Whether the host tier holds the parked sessions once ``arriving`` are parked too and
        ``leaving`` are restored."""
        parked = [s for s in self.parked() if s not in leaving] + list(arriving)
        pages = sum(self.cap.pages(self.sessions[s].committed) for s in parked)
        return len(parked) <= self.max_parked and pages <= self.host_pages

    def lru_victims(self, rows: int, kv: int, keep: str = "") -> list[str] | None:
        """The least recently active idle resident sessions to park so that ``rows`` session
        slots and ``kv`` KV token slots are free; None when parking them all would not do."""
        free_rows, free_kv = self.gpu_free()
        victims = []
        for sid in self.idle_resident(keep):
            if free_rows >= rows and free_kv >= kv:
                break
            victims.append(sid)
            free_rows += 1
            # parking it frees the pages it holds alone (not those shared, even with a victim)
            only = [p for p in self.sessions[sid].pages if self.holders(p) == 1]
            free_kv += len(only) * self.cap.page_size
        return victims if free_rows >= rows and free_kv >= kv else None

    def place_new(self) -> tuple[list[str], bool] | None:
        """Where a new session goes: (the idle sessions parked to make GPU room, whether it is
        born parked); None when neither the GPU nor the host has room."""
        self.evict_until(1, 0)
        free_rows, _ = self.gpu_free()
        victims = [] if free_rows else self.lru_victims(1, 0)
        if victims is not None and self.host_fits(victims):
            return victims, False
        if len(self.parked()) < self.max_parked:
            return [], True
        return None

    def room_for_turn(self, sid: str, target: int) -> list[str] | None:
        """The idle sessions parked so that ``sid``'s turn holds ``target`` positions on the GPU
        (restoring it first when it is parked, through the host when the host is full); None
        when that room cannot be made now."""
        m = self.sessions[sid]
        if m.parked:
            self.evict_until(1, self.held(target))
            victims = self.lru_victims(1, self.held(target))
            fits = victims is not None and (
                self.host_fits(victims) or self.host_fits(victims, leaving=[sid])
            )
        else:
            need = self.held(target) - self.held(m.committed)
            self.evict_until(0, need + self.cap.page_size)
            victims = [] if need <= self.gpu_free()[1] else self.lru_victims(0, need, sid)
            fits = victims is not None and self.host_fits(victims)
        return victims if fits else None

    def parked_after_idle(self, now: float, idle_s: float) -> list[str]:
        """The sessions that parking those idle for ``idle_s`` parks: least recently active
        first, while they have been idle that long and the host holds them."""
        batch: list[str] = []
        for sid in self.idle_resident():
            if now - self.sessions[sid].last < idle_s or not self.host_fits([*batch, sid]):
                break
            batch.append(sid)
        return batch

    def place_fork(self, parent: str) -> tuple[list[str], bool] | None:
        """Where a fork of ``parent`` goes: (the idle sessions parked to make GPU room, whether
        it is born parked); None when neither the GPU nor the host has room. A resident parent
        shares its whole pages, so the child needs one page at most; a parked one is copied."""
        m = self.sessions[parent]
        page = self.cap.page_size
        if m.parked:
            need, keep = self.held(m.committed), ""
        else:
            need, keep = (page if m.committed % page else 0), parent
        self.evict_until(1, need)
        free_rows, free_kv = self.gpu_free()
        if free_rows >= 1 and free_kv >= need:
            return [], False
        victims = self.lru_victims(1, need, keep)
        if victims and self.host_fits(victims):
            return victims, False
        parked = self.parked()
        pages = sum(self.cap.pages(self.sessions[s].committed) for s in parked)
        if len(parked) < self.max_parked and pages + self.cap.pages(m.committed) <= self.host_pages:
            return [], True
        return None

    def fork_pages(self, parent: str) -> list[int]:
        """The GPU pages of a resident fork of ``parent``."""
        m = self.sessions[parent]
        whole = m.committed // self.cap.page_size
        if m.parked:
            return self.fresh_pages(self.cap.pages(m.committed))
        return m.pages[:whole] + self.fresh_pages(self.cap.pages(m.committed) - whole)

    def park(self, sids: list[str]) -> None:
        for sid in sids:
            self.sessions[sid].parked = True
            self.sessions[sid].pages = []

    # ----- what the pools must show -----------------------------------------------------------

    def expect(self) -> dict[str, PoolStats]:
        resident = [m for m in self.sessions.values() if not m.parked]
        idle = [m for m in resident if m.turn is None]
        running = [m for m in resident if m.turn is not None]
        parked = [m for m in self.sessions.values() if m.parked]
        running_pages = self.distinct(running)
        idle_pages = self.distinct(idle) - running_pages
        cached_pages = {p for e in self.cache for p in e.pages} - running_pages - idle_pages
        want = self.cap.expect(
            idle=len(idle),
            running=len(running),
            idle_pages=len(idle_pages),
            running_pages=len(running_pages),
            cached=len(self.cache),
            cached_pages=len(cached_pages),
        )
        if self.max_parked:
            page = self.cap.page_size
            pages = sum(self.cap.pages(m.committed) for m in parked)
            held = len(parked)
            want["host_mamba"] = PoolStats(
                "host_mamba", self.max_parked, self.max_parked - held, 0, held
            )
            want["host_kv_tokens"] = PoolStats(
                "host_kv_tokens",
                self.host_pages * page,
                (self.host_pages - pages) * page,
                0,
                pages * page,
            )
        return want
