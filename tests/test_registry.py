"""``ReplicaRegistry``: the one owner of the router's replica entries and of their health.

The registry is plain data (no actor): these tests drive it as the router's collaborators do,
with sentinel objects standing in for actor handles (the registry only stores them), and check
each transition against the states written out here, not against the registry's own reads.
"""

from __future__ import annotations

import pytest

from replica.api import ReplicaDescription
from router.control.api import ReplicaHealth
from router.control.registry import ReplicaRegistry


def desc(replica_id: str, incarnation: str) -> ReplicaDescription:
    return ReplicaDescription(replica_id, "node-a", incarnation, 2, 512, 4096, 128)


def test_register_adds_a_healthy_entry_and_refreshes_it_in_place():
    registry, first, second, store = ReplicaRegistry(), object(), object(), object()
    entry = registry.register("r1", first, desc("r1", "inc-1"), checkpoints=store)
    assert (entry.handle, entry.health, entry.checkpoints) == (first, ReplicaHealth.HEALTHY, store)
    entry.reserved = 3  # the entry's own figure: a refresh keeps it
    registry.set_draining(entry, True)
    again = registry.register("r1", second, desc("r1", "inc-1"))
    assert again is entry
    assert (again.handle, again.health, again.reserved) == (second, ReplicaHealth.HEALTHY, 3)
    assert again.checkpoints is store  # kept when the re-registration names none
    assert list(registry) == ["r1"] and "r1" in registry and registry["r1"] is entry


def test_a_new_incarnation_gets_a_new_entry():
    registry = ReplicaRegistry()
    old = registry.register("r1", object(), desc("r1", "inc-1"))
    old.lost = 5
    new = registry.register("r1", object(), desc("r1", "inc-2"))
    assert new is not old and new.lost == 0 and registry.get("r1") is new


def test_draining_and_back():
    registry = ReplicaRegistry()
    entry = registry.register("r1", object(), desc("r1", "inc-1"))
    registry.set_draining(entry, True)
    assert entry.health == ReplicaHealth.DRAINING
    registry.set_draining(entry, False)
    assert entry.health == ReplicaHealth.HEALTHY


def test_a_drain_that_ends_after_the_replica_died_leaves_it_dead():
    """The drainer awaits the replica's drain call, then sets the health: a death in between
    (the health monitor's mark_dead) must win."""
    registry = ReplicaRegistry()
    entry = registry.register("r1", object(), desc("r1", "inc-1"))
    assert registry.mark_dead("r1")
    for draining in (True, False):
        registry.set_draining(entry, draining)
        assert entry.health == ReplicaHealth.DEAD


def test_a_replica_dies_once_and_its_incarnation_is_fenced():
    registry, handle = ReplicaRegistry(), object()
    entry = registry.register("r1", handle, desc("r1", "inc-1"))
    other = registry.register("r2", object(), desc("r2", "inc-9"))
    assert registry.live_handles() == {"r1": handle, "r2": other.handle}
    assert registry.mark_dead("r1") is True
    assert entry.health == ReplicaHealth.DEAD and entry.died_at is not None
    died_at = entry.died_at
    assert registry.mark_dead("r1") is False  # already dead: nothing changes
    assert entry.died_at == died_at
    assert registry.mark_dead("nobody") is False
    assert registry.is_fenced("inc-1") and not registry.is_fenced("inc-9")
    assert registry.live_handles() == {"r2": other.handle}
    assert "r1" in registry  # a dead replica stays listed (DEAD) until it is forgotten


def test_forget_dead_removes_only_the_entry_it_was_given():
    registry = ReplicaRegistry()
    dead = registry.register("r1", object(), desc("r1", "inc-1"))
    registry.mark_dead("r1")
    fresh = registry.register("r1", object(), desc("r1", "inc-2"))  # the id came back
    assert registry.forget_dead("r1", dead) is False
    assert registry.get("r1") is fresh
    registry.register("r2", object(), desc("r2", "inc-3"))
    registry.mark_dead("r1")
    registry.mark_dead("r2")
    for replica_id, entry in registry.items():  # a copy: forgetting while iterating is safe
        assert registry.forget_dead(replica_id, entry) is True
    assert registry.get("r1") is None and list(registry) == []


def test_retire_forgets_the_replica_and_fences_it():
    registry = ReplicaRegistry()
    registry.register("r1", object(), desc("r1", "inc-1"))
    registry.retire("r1")
    assert "r1" not in registry and registry.is_fenced("inc-1")
    with pytest.raises(KeyError):
        registry.retire("r1")


def test_fenced_incarnations_are_bounded():
    registry = ReplicaRegistry(max_fenced=2)
    for n in range(3):
        registry.register(f"r{n}", object(), desc(f"r{n}", f"inc-{n}"))
        registry.mark_dead(f"r{n}")
    assert [registry.is_fenced(f"inc-{n}") for n in range(3)] == [False, True, True]


def test_a_new_checkpoint_store_counts_one_epoch_more_and_a_dead_replica_takes_none():
    """A failover opens a blank session again only when the store it reads has followed the
    replica since the open (``BlankOpen.store_epoch``): each new store must be one epoch more."""
    registry, first, second = ReplicaRegistry(), object(), object()
    entry = registry.register("r1", object(), desc("r1", "inc-1"), checkpoints=first)
    assert entry.store_epoch == 0
    assert registry.replace_store("r1", first) and entry.store_epoch == 0  # the same store
    assert registry.replace_store("r1", second)
    assert (entry.checkpoints, entry.store_epoch) == (second, 1)
    assert registry.live_stores() == {"r1": second}
    assert registry.mark_dead("r1")
    assert not registry.replace_store("r1", object())
    assert (entry.checkpoints, entry.store_epoch) == (second, 1)
    assert not registry.replace_store("unknown", object())
