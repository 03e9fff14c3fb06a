"""The counted failpoints of ``replica.failpoints`` (``import_*``, ``finish_export_*``): set by
name (``name`` or ``name:N``) they fire once, on the N-th occurrence; ``arm`` sets one on a live
replica; unknown names and counts are refused. What each fault does to a move is shown end to
end in tests/test_e2e_migration_faults.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from replica import failpoints
from replica.failpoints import CallFaults, InjectedCallError


def occurrences(faults: CallFaults, name: str, n: int) -> list[bool]:
    return [faults.fires(name) for _ in range(n)]


def test_a_counted_fault_fires_once_on_its_nth_occurrence():
    faults = CallFaults(failpoints.parse("import_fails:3,finish_export_crashes"))
    assert occurrences(faults, "import_fails", 5) == [False, False, True, False, False]
    assert occurrences(faults, "finish_export_crashes", 3) == [True, False, False]
    assert occurrences(faults, "import_crashes", 3) == [False] * 3  # not set: inert


def test_raise_if_raises_an_application_error_once():
    faults = CallFaults(failpoints.parse("finish_export_fails"))
    with pytest.raises(InjectedCallError, match="finish_export_fails"):
        faults.raise_if("finish_export_fails", "finish_export")
    faults.raise_if("finish_export_fails", "finish_export")  # disarmed


def test_arm_sets_a_fault_on_a_live_replica_and_refuses_others():
    faults = CallFaults(frozenset())
    faults.arm("import_fails", 2)
    assert occurrences(faults, "import_fails", 3) == [False, True, False]
    for name, n in (("replica_call_raises", 1), ("import_fails", 0), ("no_such_fault", 1)):
        with pytest.raises(ValueError):
            faults.arm(name, n)


def test_the_new_names_parse_and_bad_counts_are_refused():
    for name in failpoints.COUNTED:
        assert failpoints.parse(f"{name}:2") == {f"{name}:2"}
        assert name in failpoints.__doc__
    with pytest.raises(ValueError):
        failpoints.parse("import_fails:0")


def test_stall_if_holds_its_caller_once_and_counts_it(monkeypatch):
    monkeypatch.setattr(failpoints, "STALL_S", 0.2)
    faults = CallFaults(failpoints.parse("import_stalls:2"))

    async def stalls() -> list[float]:
        took = []
        for _ in range(3):
            start = time.monotonic()
            await faults.stall_if("import_stalls")
            took.append(time.monotonic() - start)
        return took

    took = asyncio.run(stalls())
    assert took[0] < 0.1 and took[1] >= 0.2 and took[2] < 0.1, took
    assert faults.stalled == 1
