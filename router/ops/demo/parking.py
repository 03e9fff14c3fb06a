"""The demo's parking phase: far more sessions open at once than the replicas have GPU slots.

Opens ``sessions`` sessions and keeps them all open (the replicas park the least recently used
ones in host memory as GPU room runs out), then runs one turn on each in random order (each turn
of a parked session restores it first, parking another), prints the pools at the moment the
most sessions were parked, the parks and restores counted on /metrics and the time to first
token of turns on parked sessions, and closes them all.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient
from router.ops.pool_table import render, rows_from_replicas

PROMPTS = ("Remember the blue door.", "What did I ask you to remember?", "Go on.", "Thanks!")


@dataclass(frozen=True, slots=True)
class ParkingResult:
    sessions: int
    gpu_slots: int  # sessions the replicas hold in GPU slots at once
    most_parked: int
    turns: int
    parks: int
    restores: int
    ttft_parked_s: tuple[float, ...]  # time to first token of turns on parked sessions

    def summary(self) -> str:
        ttft = sorted(self.ttft_parked_s)
        p50 = f"{statistics.median(ttft) * 1e3:.0f} ms" if ttft else "-"
        return (
            f"parking: {self.sessions} sessions open at once on {self.gpu_slots} GPU session "
            f"slots ({self.most_parked} parked in host memory at most); a turn on each in random "
            f"order: {self.turns} turns, {self.parks} parks and {self.restores} restores; "
            f"time to first token of a parked session's turn p50 {p50}"
        )


def parking_counters(metrics_url: str) -> tuple[int, int, int]:
    """Parks, restores and open sessions, summed over replicas, from the /metrics endpoint."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    wanted = (
        "session_router_session_parks_total",
        "session_router_session_restores_total",
        "session_router_sessions",
    )
    totals = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return tuple(int(totals[name]) for name in wanted)


async def settled_counters(metrics_url: str, timeout: float = 10.0) -> tuple[int, int]:
    """Parks and restores once /metrics shows every session closed (its views lag the
    replicas by a report and a poll, about 2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        parks, restores, open_sessions = await asyncio.to_thread(parking_counters, metrics_url)
        if open_sessions == 0 or time.monotonic() > deadline:
            return parks, restores
        await asyncio.sleep(0.25)


async def run_parking_phase(
    client: AsyncSessionClient, metrics_url: str, sessions: int, concurrency: int, seed: int
) -> ParkingResult:
    rng = random.Random(seed)
    replicas = await client.replicas()
    gpu_slots = sum(p.capacity for r in replicas for p in r.pools if p.pool == "req")
    parks0, restores0 = await settled_counters(metrics_url)
    opened = [await client.open(timeout=60) for _ in range(sessions)]
    parked_moment = await client.replicas()
    ids = [s.session_id for s in opened]
    was_parked = {
        s.session_id
        for s in await asyncio.gather(
            *(client.sessions.GetSession(pb.GetSessionRequest(session_id=i)) for i in ids)
        )
        if s.parked
    }
    rng.shuffle(ids)
    ttft: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def turn(session_id: str) -> None:
        async with gate:
            start = time.perf_counter()
            first = True
            async for chunk in client.generate(
                session_id, text=rng.choice(PROMPTS), max_new_tokens=6
            ):
                if first and chunk.token_ids and session_id in was_parked:
                    ttft.append(time.perf_counter() - start)
                    first = False

    await asyncio.gather(*(turn(i) for i in ids))
    print(
        f"parking (all {sessions} sessions open, the least recently used parked):\n"
        + render(rows_from_replicas(parked_moment))
        + "\n",
        flush=True,
    )
    await asyncio.gather(*(client.close_session(i) for i in ids))
    parks, restores = await settled_counters(metrics_url)
    return ParkingResult(
        sessions,
        gpu_slots,
        sum(r.sessions_parked for r in parked_moment),
        len(ids),
        parks - parks0,
        restores - restores0,
        tuple(ttft),
    )
