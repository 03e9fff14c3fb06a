"""A turn that names the state it continues (a chat turn: ``submit_batch`` given the committed
tokens its caller saw the session end at) goes only on exactly that state, and so its end is not
held for its checkpoint: a failover that restored an older state is found by the next turn,
which is refused with nothing done (no fork made, no rollback point released, pools as before)
and the caller replays its conversation. Strict accounting after each."""

from __future__ import annotations

import asyncio

from replica.actor.batch_calls import NOT_FED, submit_batch
from replica.api import ForkedTurn
from replica.checkpoints.outbox import CheckpointOutbox
from replica.config import PoolConfig
from replica.engine.step_outputs import StepOutputs
from tests.support.engine import close_and_check, drain, greedy, make_engine, run_turn, token_ids

GATEWAY = "gw-test"


def engine():
    pools = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, page_size=16,
                       max_cached_states=0)  # fmt: skip
    return make_engine(pools, session_checkpoints=True)


def test_a_turn_on_another_state_than_the_one_it_names_is_not_fed_and_changes_nothing():
    eng = engine()
    eng.open_session("p")
    run_turn(eng, "p", token_ids(20, 1), greedy(3))
    eng.fork_session("p", "old")  # the previous rollback point
    held = eng.session_info("p").committed_tokens
    before = eng.check_invariant().pools
    fork = ("c", 15.0, "old")
    for named in (held - 3, held + 1, 0):  # an older state (a failover's), a newer one, none
        [result] = submit_batch(eng, GATEWAY, [("p", token_ids(4, 2), greedy(2), fork, named)])
        assert result is NOT_FED
        [result] = submit_batch(eng, GATEWAY, [("p", token_ids(4, 2), greedy(2), None, named)])
        assert result is NOT_FED
        assert "c" not in eng.sessions.sessions and "old" in eng.sessions.sessions
        assert eng.check_invariant().pools == before
        assert not eng.has_work
    [result] = submit_batch(eng, GATEWAY, [("p", token_ids(4, 2), greedy(2), fork, held)])
    assert isinstance(result, ForkedTurn) and result.replaced
    drain(eng)
    assert eng.session_info("p").committed_tokens == held + 4 + 2
    assert eng.close_session("c")
    eng.check_invariant()
    close_and_check(eng)


def test_only_a_named_state_turns_end_goes_on_before_the_store_has_its_checkpoint():
    """Both sessions' turns end; the store has taken neither checkpoint yet: the named-state
    turn's end goes on at once, the plain turn's waits for the store's take. Both sessions
    count as protected only once the store has their checkpoints."""
    eng = engine()
    eng.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    for sid in ("chat", "plain"):
        eng.open_session(sid)
    eng.session_ops.take_checkpoints()  # their blank entries
    results = submit_batch(
        eng,
        GATEWAY,
        [("chat", token_ids(5, 3), greedy(2), None, 0), ("plain", token_ids(5, 4), greedy(2))],
    )
    assert all(isinstance(r, int) for r in results)
    ends = [e for e in drain(eng) if e.finished]
    assert {e.session_id for e in ends} == {"chat", "plain"}
    batch = eng.session_ops.take_checkpoints()
    assert batch.unheld == ["chat"] and len(batch.saved) == 2

    async def deliver() -> list[list[str]]:
        sent: list[StepOutputs] = []
        outbox = CheckpointOutbox(sent.extend, capacity=4)
        stream = outbox.stream(False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the store's call has started: it follows
        outbox.push(batch)
        outbox.dispatch([StepOutputs([e for e in ends if e.session_id == "chat"])])
        seen = [[e.session_id for out in sent for e in out.events]]
        outbox.dispatch([StepOutputs([e for e in ends if e.session_id == "plain"])])
        assert len(await first) == 2 and outbox.protected == frozenset()
        await asyncio.sleep(0.05)  # longer than a step waits whole for the store's take
        seen.append([e.session_id for out in sent for e in out.events])
        resumed = asyncio.ensure_future(stream.__anext__())  # the store took the item
        await asyncio.sleep(0)
        seen.append([e.session_id for out in sent for e in out.events])
        assert outbox.protected == {"chat", "plain"}
        outbox.disconnect("the test ends")
        await asyncio.gather(resumed, return_exceptions=True)
        return seen

    assert asyncio.run(deliver()) == [["chat"], ["chat"], ["chat", "plain"]]
    close_and_check(eng)
