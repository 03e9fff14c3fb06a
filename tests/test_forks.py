"""Forked sessions continue exactly as their parent would: the engine over a checkpoint saved by
transformers, a fork's turns against ``BambaForCausalLM.generate`` over the same token sequence
(greedy), and against a cold session that prefilled that sequence (seeded sampling). Forks twice
from one parent, from a running turn, from a parked parent (into the GPU, and into the host tier
when every GPU slot runs a turn), and after the parent moved to another engine. Every test ends
with every slot back (strict)."""

from __future__ import annotations

import pytest

from replica.api import SamplingParams
from replica.config import PoolConfig
from replica.model import build_tiny
from tests.support.engine import (
    close_and_check,
    greedy,
    make_checkpoint_engine,
    make_engine,
    run_turn,
    token_ids,
)
from tests.support.hf_peer import hf_greedy, saved_peer


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return saved_peer(tmp_path_factory, seed=11)


def pools(page_size: int, parked: int = 0) -> PoolConfig:
    return PoolConfig(
        max_sessions=4,
        kv_tokens=1024,
        max_context=256,
        page_size=page_size,
        max_parked_sessions=parked,
        host_kv_tokens=1024 if parked else 0,
        max_cached_states=0,  # these tests count the pages forks share: no cached state shares
    )


@pytest.fixture(params=[1, 16], ids=["page1", "page16"])
def page_size(request):
    return request.param


@pytest.fixture
def engine(peer, page_size):
    eng = make_checkpoint_engine(peer[1], pools(page_size, parked=4), max_prefill_chunk=24)
    yield eng
    close_and_check(eng)


def test_two_forks_continue_as_the_parent_would(peer, engine, page_size):
    hf, _ = peer
    a = token_ids(29, 1)  # 29 + 10 = 39 committed: a partial last page at page 16
    engine.open_session("p", tenant="t1")
    o1, _, committed = run_turn(engine, "p", a, greedy(10))
    engine.fork_session("p", "c1")
    engine.fork_session("p", "c2")
    assert engine.session_info("c1").committed_tokens == committed
    assert engine.sessions.get("c2").tenant == "t1"
    if page_size == 16:  # whole pages shared, only the partial one copied
        assert engine.pool.kv_pool.page_allocator.shared_refs == 2 * (39 // 16)
        assert engine.sessions.forker.kv_bytes_copied > 0
    engine.check_invariant()
    b1, b2, b3 = token_ids(7, 2), token_ids(5, 3), token_ids(9, 4)
    assert run_turn(engine, "c1", b1, greedy(8))[0] == hf_greedy(hf, a + o1 + b1, 8)
    assert run_turn(engine, "p", b3, greedy(6))[0] == hf_greedy(hf, a + o1 + b3, 6)
    assert run_turn(engine, "c2", b2, greedy(8))[0] == hf_greedy(hf, a + o1 + b2, 8)
    engine.check_invariant()


def test_a_seeded_fork_samples_as_a_cold_session(peer, page_size):
    """Same seed, same state: the fork's tokens are those of a session that prefilled the
    parent's whole sequence itself."""
    eng = make_checkpoint_engine(peer[1], pools(page_size), max_prefill_chunk=24)
    seeded = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
    a, b = token_ids(33, 5), token_ids(6, 6)
    eng.open_session("p")
    o1, _, _ = run_turn(eng, "p", a, greedy(4))
    eng.fork_session("p", "c")
    forked = run_turn(eng, "c", b, seeded)[0]
    eng.open_session("cold")
    run_turn(eng, "cold", a + o1, greedy(0))
    assert forked == run_turn(eng, "cold", b, seeded)[0]
    assert forked == run_turn(eng, "p", b, seeded)[0]
    close_and_check(eng)


def test_fork_during_a_turn_takes_the_committed_state(peer, engine):
    hf, _ = peer
    a, b, c = token_ids(30, 7), token_ids(4, 8), token_ids(6, 9)
    engine.open_session("p")
    o1, _, committed = run_turn(engine, "p", a, greedy(5))
    engine.submit("p", b, greedy(20))
    for _ in range(3):
        engine.step()  # the parent's turn has folded some of it in by now
    assert engine.sessions.get("p").turn is not None
    engine.fork_session("p", "c")
    assert engine.session_info("c").committed_tokens == committed
    engine.check_invariant()
    assert run_turn(engine, "c", c, greedy(7))[0] == hf_greedy(hf, a + o1 + c, 7)


def test_fork_of_a_parked_parent_copies_from_the_host(peer, engine):
    hf, _ = peer
    a, b = token_ids(26, 10), token_ids(5, 11)
    engine.open_session("p")
    o1, _, _ = run_turn(engine, "p", a, greedy(6))
    engine.sessions.residency.park([engine.sessions.get("p")])
    engine.fork_session("p", "c")
    assert engine.sessions.get("p").parked  # the parent stays where it was
    assert engine.pool.kv_pool.page_allocator.shared_refs == 0  # nothing shared across tiers
    engine.check_invariant()
    assert run_turn(engine, "c", b, greedy(8))[0] == hf_greedy(hf, a + o1 + b, 8)
    assert run_turn(engine, "p", b, greedy(8))[0] == hf_greedy(hf, a + o1 + b, 8)


def test_fork_when_the_gpu_is_full_parks_an_idle_session(peer, engine):
    hf, _ = peer
    a, b = token_ids(20, 12), token_ids(5, 13)
    engine.open_session("p")
    o1, _, _ = run_turn(engine, "p", a, greedy(3))
    for i in range(3):
        engine.open_session(f"idle{i}")
    engine.fork_session("p", "c")  # parks the least recently used idle one, never the parent
    assert sorted(engine.sessions.parked) == ["idle0"]
    assert not engine.sessions.get("c").parked
    engine.check_invariant()
    assert run_turn(engine, "c", b, greedy(6))[0] == hf_greedy(hf, a + o1 + b, 6)


def test_fork_when_every_other_slot_runs_is_born_parked(peer, engine):
    hf, _ = peer
    a, b = token_ids(20, 17), token_ids(5, 18)
    engine.open_session("p")
    o1, _, _ = run_turn(engine, "p", a, greedy(3))
    for i in range(3):
        engine.open_session(f"busy{i}")
        engine.submit(f"busy{i}", token_ids(8, 20 + i), greedy(40))
    engine.step()
    engine.fork_session("p", "c")
    assert engine.sessions.get("c").parked and not engine.sessions.get("p").parked
    engine.check_invariant()
    assert run_turn(engine, "c", b, greedy(6))[0] == hf_greedy(hf, a + o1 + b, 6)


@pytest.mark.parametrize("page_size", [1, 16])
def test_fork_of_a_parked_parent_when_every_slot_runs_is_born_parked(page_size):
    """The child's state is copied from the parent's host slots into host slots of its own,
    inside the one host pool: a copy whose source and target are one tensor (with one layer of
    a kind, here Nemotron-H's one attention layer, PyTorch refuses a gather into a view of its
    own source). The child then continues exactly as its parent does."""
    engine = make_engine(pools(page_size, parked=4), build_tiny("tiny-nemotron-h", seed=0))
    a, b = token_ids(20, 21), token_ids(5, 22)
    engine.open_session("p")
    run_turn(engine, "p", a, greedy(3))
    engine.sessions.residency.park([engine.sessions.get("p")])
    for i in range(4):
        engine.open_session(f"busy{i}")
        engine.submit(f"busy{i}", token_ids(8, 30 + i), greedy(40))
    engine.step()
    engine.fork_session("p", "c")
    assert engine.sessions.get("c").parked and engine.sessions.get("p").parked
    engine.check_invariant()
    for i in range(4):
        engine.cancel(f"busy{i}")
    assert run_turn(engine, "c", b, greedy(6))[0] == run_turn(engine, "p", b, greedy(6))[0]
    close_and_check(engine)


def test_forks_after_the_parent_moved(peer, page_size):
    """A fork stays with its replica when its parent moves; the moved parent carries its own
    copy of the shared pages and forks again on its new replica."""
    hf, path = peer
    source = make_checkpoint_engine(path, pools(page_size), max_prefill_chunk=24)
    target = make_checkpoint_engine(path, pools(page_size), max_prefill_chunk=24)
    a, b, c = token_ids(35, 14), token_ids(5, 15), token_ids(8, 16)
    source.open_session("p")
    o1, _, _ = run_turn(source, "p", a, greedy(4))
    source.fork_session("p", "stays")
    _, record = source.moves.export(["p"])
    target.moves.import_([record])
    source.moves.finish(["p"], moved=True)
    source.check_invariant()
    assert source.pool.kv_pool.page_allocator.shared_refs == 0  # the fork holds them alone now
    target.fork_session("p", "c")
    want = hf_greedy(hf, a + o1 + b, 6)
    assert run_turn(source, "stays", b, greedy(6))[0] == want
    assert run_turn(target, "c", b, greedy(6))[0] == want
    assert run_turn(target, "p", c, greedy(6))[0] == hf_greedy(hf, a + o1 + c, 6)
    close_and_check(source)
    close_and_check(target)


def test_a_forks_checkpoint_restores_it_on_another_engine(peer, page_size):
    """A fork is checkpointed when it is made, with its own copy of the shared pages: restored
    from that record alone (as failover does), it continues as the parent would."""
    hf, path = peer
    source = make_checkpoint_engine(
        path, pools(page_size), max_prefill_chunk=24, session_checkpoints=True
    )
    source.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    a, b = token_ids(27, 19), token_ids(6, 20)
    source.open_session("p")
    o1, _, _ = run_turn(source, "p", a, greedy(5))
    source.session_ops.take_checkpoints()
    source.fork_session("p", "c")
    (record,) = source.session_ops.take_checkpoints().saved
    assert [m.session_id for m in record.sessions] == ["c"]
    source.session_ops.close_all()  # the replica is gone, with every page it shared
    target = make_checkpoint_engine(path, pools(page_size), max_prefill_chunk=24)
    target.moves.import_([record])
    assert run_turn(target, "c", b, greedy(7))[0] == hf_greedy(hf, a + o1 + b, 7)
    close_and_check(source)
    close_and_check(target)
