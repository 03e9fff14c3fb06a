"""``DecodeGraphs``' bookkeeping on the CPU, where no CUDA graph can be captured: the graphs are
recorded by a stand-in whose replay reruns the recorded forward on the same input tensors into
the same output (what a CUDA graph's replay does, kernel for kernel). Steps through the graphs
give the eager forward's logits and state for the real rows, one graph per shape the steps ran;
a graph that replays stale logits (one that baked its capture's inputs) and a capture that fails
both turn the graphs off, and every step from then on is eager. The graphs themselves run in
tests/gpu/test_decode_graphs.py."""

from __future__ import annotations

import torch

from replica.engine.decode_graphs import DecodeGraphs
from replica.engine.decode_shapes import DecodeShapes
from tests.support.device import on_test_device
from tests.support.engine import tiny_bamba, token_ids
from tests.support.pools import make_pools

LENGTHS = (12, 40, 70)  # three sessions' tokens before they decode
STEPS = 6


class Rerun:
    """A recorded forward whose replay runs it again into the recorded output."""

    def __init__(self, forward) -> None:
        self.forward = forward
        self.logits = forward()

    def replay(self) -> None:
        with torch.inference_mode():  # the output is the forward's: an inference tensor
            self.logits.copy_(self.forward())


class Stale(Rerun):
    """A graph that baked its capture's inputs: its replays give the capture's logits."""

    def replay(self) -> None:
        pass


def record_with(kind):
    def record(forward):
        graph = kind(forward)
        return graph, graph.logits

    return record


def failing_record(forward):
    raise RuntimeError("operation not permitted when stream is capturing")


def _pool_with_sessions():
    """A pool whose three sequences hold the prefill of ``LENGTHS`` tokens (KV reserved for
    ``STEPS`` more)."""
    cfg, model, _ = tiny_bamba()
    model = on_test_device(model)
    pool, _, _ = make_pools(max_sessions=6, kv_tokens=1024, page_size=16, track=0, model=cfg)
    seqs = pool.alloc_seqs(len(LENGTHS))
    for i, (seq, n) in enumerate(zip(seqs, LENGTHS, strict=True)):
        pool.kv_pool.extend(pool.req_to_token, seq.req_pool_idx, 0, n + STEPS)
        slots = pool.req_to_token[seq.req_pool_idx, :n]
        ids = torch.tensor(token_ids(n, i))
        model.forward_extend(ids, 0, seq.mamba_pool_idx, slots, pool.buffers)
    return model, pool, seqs


def _states(pool, seqs) -> list[torch.Tensor]:
    slots = [s.mamba_pool_idx for s in seqs]
    return [pool.mamba_pool.conv_all[:, slots], pool.mamba_pool.ssm_all[:, slots]]


def _decode(model, graphs, pool, seqs, active: int, step: int, shapes: DecodeShapes):
    """One decode step of the first ``active`` sequences, padded; the real rows' logits."""
    pad = shapes.batch(active) - active
    seqs = seqs[:active]
    positions = torch.tensor([n + step for n in LENGTHS[:active]] + [step] * pad)
    ids = torch.tensor([(7 * step + i) % 384 for i in range(active)] + [0] * pad)
    rows = torch.tensor([s.req_pool_idx for s in seqs] + [pool.scratch_row] * pad)
    slots = torch.tensor([s.mamba_pool_idx for s in seqs] + [pool.mamba_pool.scratch_slot] * pad)
    kv = pool.req_to_token[rows, : shapes.width(int(positions.max()) + 1)]
    if graphs is None:
        scratch = pool.mamba_pool.scratch_slot
        logits = model.forward_decode(
            ids, positions, slots, kv, positions + 1, pool.buffers, None, scratch
        )
    else:
        logits = graphs.forward(ids, positions, slots, kv)
    return logits[:active].clone()


def _run(record):
    """The graphs' steps beside the eager ones on a twin pool: 3 rows (run as 4) for
    ``STEPS - 2`` steps, then 1 row; the real rows' logits and states of both."""
    shapes = DecodeShapes.padded(6, 256)
    model, pool, seqs = _pool_with_sessions()
    _, twin, twin_seqs = _pool_with_sessions()
    graphs = DecodeGraphs(model, pool, shapes, record)
    out = []
    for step in range(STEPS):
        active = 3 if step < STEPS - 2 else 1
        got = _decode(model, graphs, pool, seqs, active, step, shapes)
        want = _decode(model, None, twin, twin_seqs, active, step, shapes)
        out.append((got, want))
    return graphs, out, _states(pool, seqs), _states(twin, twin_seqs)


def test_graph_steps_give_the_eager_logits_and_state():
    graphs, steps, states, twin_states = _run(record_with(Rerun))
    assert graphs.off is None
    assert set(graphs.graphs) == {(4, 128), (1, 64)}  # 70 + 4 positions; then 12 + 5
    for got, want in steps:
        torch.testing.assert_close(got, want)
    for got, want in zip(states, twin_states, strict=True):
        torch.testing.assert_close(got, want)


def test_a_graph_that_replays_stale_logits_turns_the_graphs_off():
    graphs, steps, states, twin_states = _run(record_with(Stale))
    assert graphs.off is not None and "replay differs from eager" in graphs.off
    assert not graphs.graphs and not graphs.serves()
    for got, want in steps:  # every step ran eagerly
        torch.testing.assert_close(got, want)
    for got, want in zip(states, twin_states, strict=True):
        torch.testing.assert_close(got, want)


def test_a_failed_capture_turns_the_graphs_off():
    graphs, steps, _, _ = _run(failing_record)
    assert graphs.off == "RuntimeError: operation not permitted when stream is capturing"
    for got, want in steps:
        torch.testing.assert_close(got, want)
