"""The client side of ``bench/chaos.py``: sessions that behave the way real clients misbehave.

Each session draws its behaviour from its own seeded ``random.Random``, so a run's load is the
same for a seed whatever the interleaving: a short open deadline (the open is abandoned), unary
sessions of 1-4 turns (normal turns with any sampling, ``temperature=1e-45`` included; client
cancels after the first chunk; short deadlines; two turns at once; bad inputs) or Converse
streams (inputs with and without pauses, so some barge in; some cancelled), ended by a close or
left to the idle timeout. Every call has a deadline: a call that hits its safety deadline is
counted as hung. Self-contained for now (the shared benchmark harness is not on this branch).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import grpc

from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient, generate_request

SAFETY_S = 60.0  # no call should take this long: one that does is hung
VOCAB = 384  # tiny-bamba
DOCUMENTED = {  # docs/api.md's status codes, plus what a client's own cancel and deadline give
    "OK",
    "CANCELLED",
    "DEADLINE_EXCEEDED",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "OUT_OF_RANGE",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "ABORTED",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
}


@dataclass
class Tally:
    sessions: Counter = field(default_factory=Counter)  # how each session ended
    calls: Counter = field(default_factory=Counter)  # status code of every call
    faults: Counter = field(default_factory=Counter)  # what the clients did wrong on purpose
    hung: int = 0

    def saw(self, code: str, short: bool) -> str:
        self.calls[code] += 1
        if code == "DEADLINE_EXCEEDED" and not short:
            self.hung += 1
        return code


def bad_input(rng: random.Random, sid: str) -> pb.GenerateRequest:
    """A request that must be refused with a documented code (or served, for 1e-45)."""
    choice = rng.randrange(7)
    if choice == 0:
        return generate_request(sid, tokens=[VOCAB + rng.randrange(1000)], max_new_tokens=2)
    if choice == 1:
        return generate_request(sid, tokens=[1], temperature=-1.0)
    if choice == 2:
        return generate_request(sid, tokens=[1], top_p=2.0)
    if choice == 3:
        return generate_request(sid, tokens=[1], max_new_tokens=10**6)  # past the context
    if choice == 4:
        return generate_request("x" * 10_000, tokens=[1])
    if choice == 5:
        return generate_request(f"{rng.getrandbits(128):032x}", tokens=[1])
    return generate_request(sid, tokens=[5, 6], max_new_tokens=4, temperature=1e-45, seed=7)


async def drain(tally: Tally, call, short: bool = False, cancel_after: int | None = None) -> str:
    """Read a response stream to its end (or cancel it after ``cancel_after`` items)."""
    try:
        seen = 0
        async for _ in call:
            seen += 1
            if cancel_after is not None and seen >= cancel_after:
                call.cancel()
                return tally.saw("CANCELLED", short)
        return tally.saw("OK", short)
    except asyncio.CancelledError:
        return tally.saw("CANCELLED", short)
    except grpc.aio.AioRpcError as exc:
        return tally.saw(exc.code().name, short)


async def unary(tally: Tally, call, short: bool = False):
    try:
        value = await call
    except grpc.aio.AioRpcError as exc:
        return tally.saw(exc.code().name, short), None
    return tally.saw("OK", short), value


async def turn(client: AsyncSessionClient, rng: random.Random, tally: Tally, sid: str) -> str:
    """One turn of a unary session; returns the code that matters for the session."""
    sessions, meta = client.sessions, client.metadata
    tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
    sampling = dict(
        max_new_tokens=rng.randint(1, 24),
        temperature=rng.choice([0.0, 0.0, 0.7, 1.3, 1e-45]),
        top_p=rng.choice([0.0, 0.9]),
        seed=rng.getrandbits(32),
    )
    request = generate_request(sid, tokens=tokens, **sampling)
    r = rng.random()
    if r < 0.12:
        tally.faults["bad inputs"] += 1
        code = await drain(
            tally, sessions.Generate(bad_input(rng, sid), metadata=meta, timeout=SAFETY_S)
        )
        return code if code in ("ABORTED", "UNAVAILABLE") else "OK"
    if r < 0.22:
        tally.faults["client cancels"] += 1
        call = sessions.Generate(request, metadata=meta, timeout=SAFETY_S)
        return await drain(tally, call, cancel_after=1)
    if r < 0.30:
        tally.faults["short deadlines"] += 1
        timeout = rng.uniform(0.005, 0.2)
        return await drain(tally, sessions.Generate(request, metadata=meta, timeout=timeout), True)
    if r < 0.34:
        tally.faults["turns at once"] += 1
        calls = [sessions.Generate(request, metadata=meta, timeout=SAFETY_S) for _ in range(2)]
        codes = await asyncio.gather(*(drain(tally, c) for c in calls))
        return "ABORTED" if "ABORTED" in codes else "OK"
    return await drain(tally, sessions.Generate(request, metadata=meta, timeout=SAFETY_S))


async def conversation(client: AsyncSessionClient, rng: random.Random, tally: Tally) -> str:
    inputs = [
        (rng.random() < 0.5, [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))])
        for _ in range(rng.randint(1, 8))
    ]

    async def requests():
        yield pb.ConverseRequest(open=pb.OpenSessionRequest())
        for pause, tokens in inputs:
            if pause:
                await asyncio.sleep(0.05)
            request = generate_request(tokens=tokens, max_new_tokens=rng.randint(1, 16))
            yield pb.ConverseRequest(input=request)

    cancel_after = None
    if rng.random() < 0.15:
        tally.faults["client cancels"] += 1
        cancel_after = rng.randint(1, 6)
    call = client.sessions.Converse(requests(), metadata=client.metadata, timeout=SAFETY_S)
    code = await drain(tally, call, cancel_after=cancel_after)
    return "completed" if code in ("OK", "CANCELLED") else code


async def session(client: AsyncSessionClient, rng: random.Random, tally: Tally) -> None:
    """One session, start to end; its outcome goes to ``tally.sessions``."""
    if rng.random() < 0.2:
        tally.sessions[await conversation(client, rng, tally)] += 1
        return
    short = rng.random() < 0.1
    if short:
        tally.faults["short deadlines"] += 1
    code, opened = await unary(
        tally,
        client.sessions.OpenSession(
            pb.OpenSessionRequest(),
            metadata=client.metadata,
            timeout=rng.uniform(0.001, 0.05) if short else SAFETY_S,
        ),
        short,
    )
    if opened is None:
        tally.sessions[code] += 1
        return
    for _ in range(rng.randint(1, 4)):
        code = await turn(client, rng, tally, opened.session_id)
        if code == "ABORTED":  # its replica died: the session is gone
            tally.sessions[code] += 1
            return
    if rng.random() < 0.25:
        tally.sessions["left to the idle timeout"] += 1
        return
    code, _ = await unary(
        tally,
        client.sessions.CloseSession(
            pb.CloseSessionRequest(session_id=opened.session_id),
            metadata=client.metadata,
            timeout=SAFETY_S,
        ),
    )
    tally.sessions["completed" if code == "OK" else code] += 1
