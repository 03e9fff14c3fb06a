"""A turn's checkpoint costs what the turn changed: after a session's first checkpoint (its whole
state) each one is a delta, the recurrent state and only the KV positions written since the one
before. Folded onto its base, a chain of deltas is byte for byte the whole state a plain export
takes at the same moment (resident or parked, page sizes 1 and 16), and a session restored from
it continues exactly as one that never moved. A delta alone is never imported. The sessions a
step leaves to checkpoint are exported in one copy and split: each record is byte for byte that
session's own export, and holds no other session's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from replica.api import IncompatibleStateError, SessionStates
from replica.checkpoints.chain import BrokenChainError, fold
from replica.config import PoolConfig
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_checkpoint_engine,
    run_turn,
    session_state,
    token_ids,
)
from tests.support.hf_peer import saved_peer


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return saved_peer(tmp_path_factory, seed=11)


def pools(page_size: int) -> PoolConfig:
    return PoolConfig(
        max_sessions=2, kv_tokens=2048, max_context=512, page_size=page_size, max_parked_sessions=2
    )


def arrays(record: SessionStates) -> tuple:
    return record.conv, record.ssm, record.k, record.v


def checkpoint(engine, session_id: str) -> SessionStates:
    saved = engine.session_ops.take_checkpoints().saved
    (record,) = [r for r in saved if r.sessions[0].session_id == session_id]
    return record


@pytest.mark.parametrize("page_size", [1, 16])
def test_deltas_fold_into_the_whole_state_and_restore_exactly(peer, page_size):
    _, path = peer
    source = make_checkpoint_engine(path, pools(page_size), session_checkpoints=True)
    source.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    unmoved = make_checkpoint_engine(path, pools(page_size))
    for engine in (source, unmoved):
        engine.open_session("s")
    assert source.session_ops.take_checkpoints().saved == []  # opened empty: nothing to lose yet
    chain = []
    for turn in range(10):
        ids = token_ids(7 + 3 * turn, turn)
        out = run_turn(source, "s", ids, greedy(5))[0]
        assert out == run_turn(unmoved, "s", ids, greedy(5))[0]
        if turn % 3 == 1:  # some deltas are taken from the host tier
            source.sessions.residency.park([source.sessions.get("s")])
        record = checkpoint(source, "s")
        (meta,) = record.sessions
        # the first is the whole state; each after it starts where the one before ended
        assert meta.kv_from == (chain[-1].sessions[0].committed_len if chain else 0)
        assert record.k.shape[1] == meta.committed_len - meta.kv_from  # what the turn wrote
        chain.append(record)
        if turn in (4, 9):  # folded, the chain is the state a whole export takes now
            whole = source.transfer.export([source.sessions.get("s")])
            folded = fold(chain)
            assert folded.sessions == whole.sessions
            for got, want in zip(arrays(folded), arrays(whole)):
                assert np.array_equal(got, want)

    target = make_checkpoint_engine(path, pools(page_size))
    imported = target.moves.import_([fold(chain)])
    assert [i.session_id for i in imported.opened] == ["s"] and not imported.refused
    ids = token_ids(9, 99)
    assert run_turn(target, "s", ids, greedy(8))[0] == run_turn(unmoved, "s", ids, greedy(8))[0]
    assert_same_state(session_state(target, "s"), session_state(unmoved, "s"), exact=True)
    for engine in (source, target, unmoved):
        close_and_check(engine)


def test_a_delta_alone_is_refused_and_a_broken_chain_is_never_folded(peer):
    _, path = peer
    source = make_checkpoint_engine(path, pools(16), session_checkpoints=True)
    source.checkpoints.enabled = True
    source.open_session("s")
    run_turn(source, "s", token_ids(20, 1), greedy(3))
    base = checkpoint(source, "s")
    run_turn(source, "s", token_ids(5, 2), greedy(3))
    first = checkpoint(source, "s")
    run_turn(source, "s", token_ids(5, 3), greedy(3))
    second = checkpoint(source, "s")
    assert first.sessions[0].kv_from > 0

    target = make_checkpoint_engine(path, pools(16))
    with pytest.raises(IncompatibleStateError, match="delta checkpoint"):
        target.moves.import_([second])
    assert target.check_invariant().leaked == 0 and not target.sessions.sessions
    with pytest.raises(BrokenChainError):
        fold([base, second])  # the delta between them is missing
    with pytest.raises(BrokenChainError):
        fold([first, second])  # no whole state to fold onto
    for engine in (source, target):
        close_and_check(engine)


def test_one_take_of_many_sessions_is_each_sessions_own_export(peer):
    _, path = peer
    pool = PoolConfig(
        max_sessions=4, kv_tokens=2048, max_context=512, page_size=16, max_parked_sessions=4
    )
    source = make_checkpoint_engine(path, pool, session_checkpoints=True)
    source.checkpoints.enabled = True
    sids = ["a", "b", "c", "d"]
    for sid in sids:
        source.open_session(sid)
    sent: dict[str, int] = {}
    for turn in range(3):
        for i, sid in enumerate(sids):
            run_turn(source, sid, token_ids(5 + 7 * i + turn, 10 * turn + i), greedy(3))
        if turn == 1:  # wholes of resident sessions, then deltas from both tiers
            source.sessions.residency.park([source.sessions.get("b"), source.sessions.get("d")])
        want = {
            sid: source.transfer.export(
                [source.sessions.get(sid)], kv_from={sid: sent[sid]} if sid in sent else None
            )
            for sid in sids
        }
        saved = source.session_ops.take_checkpoints().saved
        assert sorted(r.sessions[0].session_id for r in saved) == sids
        for record in saved:
            (meta,) = record.sessions
            assert record.sessions == want[meta.session_id].sessions
            assert meta.kv_from == sent.get(meta.session_id, 0)
            for got, own in zip(arrays(record), arrays(want[meta.session_id])):
                assert np.array_equal(got, own) and got.flags.owndata
        sent = {sid: source.sessions.get(sid).committed_len for sid in sids}
    close_and_check(source)
