"""Running a state machine that must fail: the proof that its oracle can catch a bug."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test


def expect_failure(
    machine: type[RuleBasedStateMachine],
    match: str,
    errors: type[Exception] | tuple[type[Exception], ...] = AssertionError,
) -> Exception:
    """Run ``machine`` under the active profile until its first failure (unshrunk: only that it
    fails matters) and return the error (one of ``errors``, an ``AssertionError`` unless given)
    matching ``match`` that it must raise. The failure must carry the failing program and the
    ``@reproduce_failure`` line that replays it."""
    first_failure = settings(
        report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate], database=None
    )
    with pytest.raises(errors, match=match) as caught:
        run_state_machine_as_test(machine, settings=first_failure)
    notes = "\n".join(getattr(caught.value, "__notes__", ()))
    assert "state = " in notes and "@reproduce_failure" in notes, notes
    return caught.value
