"""``bench.mixed_step`` times a step as two forwards and as one padded forward: the same work,
which the bench checks before it times them (the padded forward's logits equal the two forwards'),
here at a small shape; and its one-row decode is a forward of that step's first row."""

from __future__ import annotations

import torch

from bench.mixed_step import step_calls, step_variants
from replica.model import build_tiny


def test_the_timed_variants_do_the_same_work():
    cfg, model, _ = build_tiny("tiny-bamba")
    calls = step_variants(model, cfg, chunks=2, rows=3)
    with torch.inference_mode():
        two, padded = calls["two"](), calls["padded"]()
        assert two.shape == padded.shape == (5, cfg.vocab_size)
        one_row = step_calls(model, cfg, 2, 3)["one row"]()
        first_row = step_calls(model, cfg, 2, 3)["two"]()[2]
    torch.testing.assert_close(one_row[0], first_row, rtol=1e-4, atol=1e-4)
