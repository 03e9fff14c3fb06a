"""The session state machine's own model of a replica's sessions, sharing no code with it.

It records every open session (resident or parked, idle or running, least recently active
first, committed and pending lengths, the values its state must hold) and, from that and the
configured sizes alone, says what must fit, which idle sessions must be parked to make room, and
what every pool (GPU and host) must count. Nothing here calls the session or pool code's own
capacity checks, LRU order or held-slot counters.
"""

from __future__ import annotations

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


@dataclass
class SessionModel:
    cap: Capacity
    max_parked: int
    host_pages: int
    sessions: dict[str, ModelSession] = field(default_factory=dict)

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
        resident = [m for m in self.sessions.values() if not m.parked]
        used = sum(self.held(m.turn.target if m.turn else m.committed) for m in resident)
        return self.cap.max_sessions - len(resident), self.cap.kv_pages * self.cap.page_size - used

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
            free_kv += self.held(self.sessions[sid].committed)
        return victims if free_rows >= rows and free_kv >= kv else None

    def place_new(self) -> tuple[list[str], bool] | None:
        """Where a new session goes: (the idle sessions parked to make GPU room, whether it is
        born parked); None when neither the GPU nor the host has room."""
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
            victims = self.lru_victims(1, self.held(target))
            fits = victims is not None and (
                self.host_fits(victims) or self.host_fits(victims, leaving=[sid])
            )
        else:
            need = self.held(target) - self.held(m.committed)
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

    def park(self, sids: list[str]) -> None:
        for sid in sids:
            self.sessions[sid].parked = True

    # ----- what the pools must show -----------------------------------------------------------

    def expect(self) -> dict[str, PoolStats]:
        resident = [m for m in self.sessions.values() if not m.parked]
        idle = [m for m in resident if m.turn is None]
        running = [m for m in resident if m.turn is not None]
        parked = [m for m in self.sessions.values() if m.parked]
        want = self.cap.expect(
            idle=len(idle),
            running=len(running),
            idle_pages=sum(self.cap.pages(m.committed) for m in idle),
            running_pages=sum(self.cap.pages(m.turn.target) for m in running),
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
