"""A decode step's Python work does not grow with its batch: the calls of one decode-only step
(cProfile's count, builtins included: ``bench.step_calls``) are the same with 1 session as with
24, greedy and seeded. Catches any per-row loop in Python on the decode path (sampling, state
update, outputs)."""

from __future__ import annotations

import pytest

from bench.step_calls import decode_calls, step_engine


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_a_decode_steps_python_calls_are_the_same_for_1_and_24_sessions(sampling):
    engine = step_engine("cpu", threads=1)
    calls = {n: decode_calls(engine, n, 4, sampling, "cpu")[0] for n in (1, 24)}
    assert calls[1] > 0
    assert calls[24] == calls[1], calls
