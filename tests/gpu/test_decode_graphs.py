"""The decode step as CUDA graphs (``DecodeGraphs``) against the eager step on the same GPU, every
family in float32 and bfloat16: the same tokens and state for a batch of sessions over two turns
whose batch shrinks and whose KV crosses a width bucket, a graph captured per shape the steps
ran, none turned off, and every slot back. A model with MoE layers runs graphs exactly where its
experts run as one grouped GEMM on this GPU in that dtype, and eagerly elsewhere. Needs a CUDA
device (skipped otherwise).
"""

from __future__ import annotations

import pytest
import torch

from replica.api import SamplingParams
from replica.config import PoolConfig
from replica.model import build_tiny
from replica.model.moe import grouped_gemm
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    drain,
    make_engine,
    session_state,
    token_ids,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: CUDA graphs run only there"
)

FAMILIES = (
    "tiny-bamba",
    "tiny-granitemoehybrid",
    "tiny-nemotron-h",
    "tiny-falcon-h1",
    "tiny-qwen3-next",
)


def _graphs_run(name: str, dtype: torch.dtype) -> bool:
    moe = "moe" in build_tiny(name)[0].layer_ffns
    return not moe or grouped_gemm(torch.device("cuda"), dtype)


def _engine(name: str, graphs: bool, dtype: torch.dtype, monkeypatch):
    monkeypatch.setenv("SESSION_ROUTER_TEST_DEVICE", "cuda")
    pools = PoolConfig(max_sessions=6, kv_tokens=2048, max_context=256, page_size=16)
    cfg, model, tok = build_tiny(name, seed=0)
    return make_engine(pools, (cfg, model.to(dtype), tok), cuda_graphs=graphs)


def _turns(engine, seed: int) -> dict[str, list[int]]:
    """Five sessions' turns of 3 to 60 new tokens (greedy and seeded): the batch runs 5, 4, ...
    rows, and the longest rows' KV passes 64 columns."""
    rids = {}
    for i, sid in enumerate("abcde"):
        sampling = SamplingParams(max_new_tokens=3 + 14 * i, temperature=0.8 * (i % 2), seed=i)
        rids[engine.submit(sid, token_ids(9 + 5 * i, seed + i), sampling).rid] = sid
    out = {sid: [] for sid in "abcde"}
    for event in drain(engine):
        assert event.error_code is None, event
        out[rids[event.turn_id]] += event.token_ids
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FAMILIES)
def test_graphs_give_the_eager_steps_tokens_and_state(name, dtype, monkeypatch):
    results = []
    for graphs in (False, True):
        engine = _engine(name, graphs, dtype, monkeypatch)
        for sid in "abcde":
            engine.open_session(sid)
        tokens = [_turns(engine, 1), _turns(engine, 20)]
        states = {sid: session_state(engine, sid) for sid in "abcde"}
        runner = engine.runner
        if graphs and not _graphs_run(name, dtype):
            assert runner.graphs is None and not runner.shapes.pads  # eager, as without graphs
        elif graphs:
            assert runner.graphs is not None and runner.graphs.off is None
            shapes = set(runner.graphs.graphs)  # 5 rows run as 6 (the buckets: 1, 2, 4, 6)
            assert {rows for rows, _ in shapes} == {1, 2, 4, 6}
            assert {width for _, width in shapes} >= {64, 128}
        else:
            assert runner.graphs is None
        results.append((tokens, states))
        close_and_check(engine)
    (want, want_states), (got, got_states) = results
    assert got == want
    for sid in "abcde":
        assert_same_state(got_states[sid], want_states[sid])
