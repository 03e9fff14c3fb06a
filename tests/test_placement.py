"""Placement policy: candidates, ranking, power-of-two choices and the no-room report."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.api import PoolSnapshot, PoolStats
from router.control.api import ReplicaHealth, ReplicaView
from router.control.placement import candidates, choose_replica, is_healthy, room_of
from router.control.room_report import room_report

MAMBA_PER_SESSION = 2
KV_PER_SESSION = 64


def make_view(
    replica_id: str,
    free_mamba: int = 8,
    free_req: int = 4,
    free_kv: int = 1024,
    health: ReplicaHealth = ReplicaHealth.HEALTHY,
    pinned: int = 0,
    snapshot: bool = True,
    snapshot_draining: bool = False,
    mamba_per_session: int = MAMBA_PER_SESSION,
    kv_per_session: int = KV_PER_SESSION,
    free_host: int | None = None,  # None: the replica does not park sessions
) -> ReplicaView:
    snap = None
    if snapshot:
        pools = (
            PoolStats("mamba", 16, free_mamba, 0, 16 - free_mamba),
            PoolStats("kv_tokens", 2048, free_kv, 0, 2048 - free_kv),
            PoolStats("req", 8, free_req, 0, 8 - free_req),
        )
        if free_host is not None:
            pools += (
                PoolStats("host_mamba", 8, free_host, 0, 8 - free_host),
                PoolStats("host_kv_tokens", 1024, 1024, 0, 0),
            )
        snap = PoolSnapshot(
            replica_id,
            "inc-1",
            pools,
            open_sessions=8 - free_req,
            running_requests=0,
            waiting_requests=0,
            taken_at=0.0,
            draining=snapshot_draining,
        )
    return ReplicaView(
        replica_id, "node-1", health, snap, 0.5, pinned, mamba_per_session, kv_per_session
    )


def test_most_free_mamba_wins():
    views = [make_view("a", free_mamba=4), make_view("b", free_mamba=10), make_view("c")]
    assert choose_replica(views) == "b"


def test_ties_go_to_fewest_pinned_then_replica_id():
    assert choose_replica([make_view("a", pinned=3), make_view("b", pinned=1)]) == "b"
    assert choose_replica([make_view("b"), make_view("a")]) == "a"


def test_draining_dead_and_unsnapshotted_replicas_are_never_chosen():
    views = [
        make_view("drain", free_mamba=16, health=ReplicaHealth.DRAINING),
        make_view("dead", free_mamba=16, health=ReplicaHealth.DEAD),
        make_view("self-draining", free_mamba=16, snapshot_draining=True),
        make_view("unknown", free_mamba=16, health=ReplicaHealth.UNSPECIFIED),
        make_view("new", snapshot=False),
        make_view("ok", free_mamba=2),
    ]
    assert choose_replica(views) == "ok"
    assert choose_replica(views[:-1]) is None
    report = room_report(views[:-1])
    assert report.draining == ("drain", "self-draining") and report.dead == ("dead",)
    assert report.not_ready == ("unknown", "new")


def test_each_pool_must_have_room():
    assert choose_replica([make_view("a", free_mamba=1)]) is None
    assert choose_replica([make_view("a", free_req=0)]) is None
    assert choose_replica([make_view("a", free_kv=KV_PER_SESSION - 1)]) is None
    assert choose_replica([make_view("a", free_mamba=2, free_req=1, free_kv=64)]) == "a"


def test_reserved_sessions_are_subtracted():
    views = [make_view("a", free_mamba=10), make_view("b", free_mamba=8)]
    assert choose_replica(views, reserved={"a": 1}) == "a"  # a: 10 - 2 = 8 ties b; a < b
    assert choose_replica(views, reserved={"a": 2}) == "b"  # a: 6 < 8
    # a full KV budget after reservations excludes the replica
    views = [make_view("a", free_kv=3 * KV_PER_SESSION)]
    assert choose_replica(views, reserved={"a": 2}) == "a"
    assert choose_replica(views, reserved={"a": 3}) is None
    assert choose_replica([make_view("a", free_req=2)], reserved={"a": 2}) is None
    room = room_of(views[0], {"a": 1})
    assert room is not None and room.free_kv_tokens == 2 * KV_PER_SESSION


def test_a_replica_that_parks_has_room_while_its_host_tier_does():
    full = dict(free_mamba=0, free_req=0, free_kv=0)
    assert choose_replica([make_view("a", **full, free_host=2)]) == "a"
    assert choose_replica([make_view("a", **full, free_host=2)], reserved={"a": 2}) is None
    assert choose_replica([make_view("a", **full, free_host=0)]) is None
    # GPU room ranks first, then host room
    views = [make_view("a", **full, free_host=8), make_view("b", free_mamba=2, free_host=0)]
    assert choose_replica(views) == "b"
    views = [make_view("a", **full, free_host=3), make_view("b", **full, free_host=5)]
    assert choose_replica(views) == "b"
    room = room_of(make_view("a", **full, free_host=3), {"a": 1})
    assert room is not None and room.parks and room.free_host == 2 and room.fits
    message = room_report([make_view("a", **full, free_host=0), make_view("b", **full)]).message()
    assert (
        "host tier full: a (0 host slots free)" in message
        and "b (" not in message.split("host tier full")[1]
    )
    assert "--max-parked-sessions" in message


def test_power_of_two_choices_beyond_threshold():
    views = [make_view(f"r{i:02d}", free_mamba=2 + (i % 7)) for i in range(40)]
    rooms = {room.replica_id: room for room in candidates(views)}
    best = choose_replica(views, p2c_threshold=64)
    assert best == "r06"  # 8 free, smallest id among ties
    seen = set()
    for seed in range(200):
        rng = random.Random(seed)
        a, b = random.Random(seed).sample(list(rooms.values()), 2)
        chosen = choose_replica(views, rng=rng, p2c_threshold=32)
        assert chosen == min((a, b), key=lambda room: room.rank_key()).replica_id
        seen.add(chosen)
    assert len(seen) > 5  # spreads load instead of herding onto r06


def test_report_messages():
    assert "no replicas registered" in room_report([]).message()
    dead = [
        make_view("a", health=ReplicaHealth.DEAD),
        make_view("b", health=ReplicaHealth.DRAINING),
    ]
    assert room_report(dead).message().startswith("all replicas draining or dead")
    full = [make_view("a", free_mamba=1), make_view("b", free_kv=10, free_req=0)]
    message = room_report(full).message()
    assert "no free mamba slots: a (1 free, 2 per session)" in message
    assert "no free req rows: b (0 free)" in message
    assert "not enough free KV tokens: b (10 free, 64 per session)" in message
    assert "starting" in room_report([make_view("a", snapshot=False)]).message()
    assert room_report([make_view("a")]).has_room


view_strategy = st.builds(
    make_view,
    replica_id=st.sampled_from([f"r{i}" for i in range(6)]),
    free_mamba=st.integers(0, 16),
    free_req=st.integers(0, 8),
    free_kv=st.integers(0, 2048),
    health=st.sampled_from(list(ReplicaHealth)),
    pinned=st.integers(0, 8),
    snapshot=st.booleans(),
    snapshot_draining=st.booleans(),
    mamba_per_session=st.integers(1, 3),
    kv_per_session=st.integers(1, 256),
    free_host=st.none() | st.integers(0, 8),
)


@settings(max_examples=300, deadline=None)
@given(
    views=st.lists(view_strategy, max_size=12, unique_by=lambda view: view.replica_id),
    reserved=st.dictionaries(st.sampled_from([f"r{i}" for i in range(6)]), st.integers(0, 4)),
    threshold=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_choice_is_always_a_candidate_with_room(views, reserved, threshold, seed):
    chosen = choose_replica(views, reserved, random.Random(seed), p2c_threshold=threshold)
    rooms = {room.replica_id: room for room in candidates(views, reserved)}
    report = room_report(views, reserved)
    assert set(report.with_room) == set(rooms)
    assert (chosen is None) == (not rooms) == (not report.has_room)
    if chosen is None:
        assert report.message()
        return
    view = next(view for view in views if view.replica_id == chosen)
    assert is_healthy(view) and view.snapshot is not None
    held = reserved.get(chosen, 0)
    gpu_room = (
        view.free_mamba - held * view.mamba_slots_per_session >= view.mamba_slots_per_session
        and view.free_req - held >= 1
        and view.free_kv_tokens - held * view.kv_tokens_per_session >= view.kv_tokens_per_session
    )
    host_room = view.parks and view.free_host_mamba - held >= 1
    assert gpu_room or host_room
    ranked = sorted(rooms.values(), key=lambda room: room.rank_key())
    if len(rooms) <= threshold:
        assert chosen == ranked[0].replica_id
    else:  # the better of two distinct samples: never the single worst candidate
        a, b = random.Random(seed).sample(list(rooms.values()), 2)
        assert chosen == min((a, b), key=lambda room: room.rank_key()).replica_id
        assert chosen != ranked[-1].replica_id
