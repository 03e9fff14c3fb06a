"""One output record per engine step, from the engine to the gateway's calls: a decode step's
Python calls do not grow with its batch; the replica's outbox sends each gateway its rows (split
only when a step's turns go to several) and the gateway's pump hands them to its sessions, which
stream exactly the engine's text; checkpoint holds keep back only the rows of the sessions they
hold, in order."""

from __future__ import annotations

import asyncio
import cProfile
import pstats

from replica.actor.gateway_outputs import GatewayOutputs
from replica.api import FinishReason, SamplingParams, TurnEvent
from replica.checkpoints.outbox import CheckpointOutbox
from replica.config import PoolConfig
from replica.engine.engine import Engine
from replica.engine.step_outputs import StepOutputs
from router.gateway.delivery import hand_out
from router.gateway.inbox import Inbox, pieces
from tests.support.engine import close_and_check, make_engine


def decode_step_calls(engine: Engine, sessions: int) -> int:
    """Python calls (cProfile, builtins included) of the second decode-only step of
    ``sessions`` greedy turns."""
    sids = [f"calls-{sessions}-{i}" for i in range(sessions)]
    for i, sid in enumerate(sids):
        engine.open_session(sid)
        engine.submit(sid, [(7 * i + j) % 250 + 1 for j in range(16)], SamplingParams(24))
    calls, full = 0, 0
    while engine.has_work:
        plan = engine.scheduler.plan()
        if not engine.scheduler.waiting and not plan.prefill and len(plan.decode) == sessions:
            full += 1
            if full == 2:
                profile = cProfile.Profile()
                profile.runcall(engine.step)
                calls = pstats.Stats(profile).total_calls
                continue
        engine.step()
    for sid in sids:
        engine.close_session(sid)
    return calls


def test_a_decode_steps_calls_do_not_grow_with_the_batch():
    engine = make_engine(PoolConfig(max_sessions=32, kv_tokens=32 * 64, max_context=64))
    decode_step_calls(engine, 4)  # warm up: what the first steps build once
    one, many = decode_step_calls(engine, 1), decode_step_calls(engine, 32)
    assert one and many <= one * 1.10, (one, many)
    close_and_check(engine)


def test_step_records_reach_each_gateways_sessions_as_the_engine_made_them():
    """Sessions of two gateways decode together; each gateway's stream, fanned out to its
    sessions' inboxes, gives each turn the tokens and text of the engine's records and its end,
    in order."""
    engine = make_engine()
    gateway_of = {f"s{i}": ("gw-a" if i % 3 else "gw-b") for i in range(6)}
    for i, (sid, gateway) in enumerate(gateway_of.items()):
        engine.open_session(sid, gateway_id=gateway)
        engine.submit(sid, [40 + i, 50, 60], SamplingParams(12), gateway_id=gateway)
    records = []
    while engine.has_work:
        records.append(engine.step())
    want: dict[str, tuple[list[int], str, FinishReason | None]] = {}
    for event in (event for record in records for event in record):
        tokens, text, _ = want.get(event.session_id, ([], "", None))
        want[event.session_id] = (
            tokens + list(event.token_ids),
            text + event.text,
            event.finish_reason,
        )
    assert all(len(tokens) == 12 for tokens, _, _ in want.values())

    async def deliver() -> dict[str, tuple[list[int], str, FinishReason | None]]:
        outputs = GatewayOutputs()
        outputs.dispatch(records)  # several steps, unread: one item per gateway, rows merged
        outputs.close()
        got = {}
        for gateway in ("gw-a", "gw-b"):
            items = [item async for item in outputs.stream(gateway)]
            assert len(items) == 1
            assert sum(type(entry) is tuple for entry in items[0]) < len(records)
            inboxes = {s: Inbox(s, "r") for s, g in gateway_of.items() if g == gateway}
            hand_out(items[0], inboxes)
            for sid, inbox in inboxes.items():
                (piece,) = pieces(await inbox.take())
                assert piece.end is not None
                got[sid] = (piece.token_ids, piece.text, piece.end.finish_reason)
        return got

    assert asyncio.run(deliver()) == want
    for tokens, text, _ in want.values():
        assert text == engine.tokenizer.decode(tokens)
    close_and_check(engine)


def test_checkpoint_holds_keep_back_the_rows_of_held_sessions_only():
    sent: list[StepOutputs] = []
    outbox = CheckpointOutbox(sent.extend, capacity=4)
    end = TurnEvent("held", 1, (5,), "e", FinishReason.STOP, 3, gateway_id="g")
    outbox.holds.hold(end)  # its turn's end waits for its checkpoint
    step = StepOutputs()
    step.add_rows(["free", "held", "free2"], [7, 2, 8], ["g"] * 3, [65, 66, 67], ["A", "B", "C"])
    outbox.dispatch([step])
    assert [(e.session_id, e.token_ids, e.text) for e in sent[0]] == [
        ("free", (65,), "A"),
        ("free2", (67,), "C"),
    ]
    outbox.holds.release("held")  # its checkpoint is stored: what it held goes on, in order
    assert [(e.session_id, e.turn_id, e.finished) for e in sent[1]] == [
        ("held", 1, True),
        ("held", 2, False),
    ]
