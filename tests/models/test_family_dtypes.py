"""Weights, recurrent state and KV in other dtypes than float32 (``--dtype``, ``--state-dtype``,
``--kv-dtype``).

Every family loaded in bfloat16 against transformers in bfloat16 on the same weights (the model
transformers saved, cast): the logits of a prompt and of a second turn that continues from the
saved state. The stated tolerance: ours is no further from transformers-in-bf16 than
transformers-in-bf16 is from transformers-in-float32 (bf16's own rounding on these weights), plus
0.01. Greedy tokens in float32 equal transformers' (test_family_engine.py, the default dtype on
the CPU). The engine's pools, parking and moves follow the dtypes, and a state record of other
dtypes is refused on import with FAILED_PRECONDITION.
"""

from __future__ import annotations

import argparse
import copy

import pytest
import torch

from bench.harness.inprocess_driver import build_engine
from replica.api import IncompatibleStateError, StatusCode
from replica.config import PoolConfig
from replica.model import LayerBuffers, load, load_model
from router.config import ServeConfig
from router.flags import add_arguments, from_arguments
from tests.models.peers import CONFIGS, VOCAB, hf_model
from tests.support.engine import (
    assert_engine_at_capacity,
    close_and_check,
    greedy,
    make_engine,
    run_turn,
    token_ids,
)
from tests.support.hf_peer import tiny_hf_bamba

NAMES = ["bamba", *sorted(CONFIGS)]
KV = 160


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``saved(name)``: (the float32 transformers peer, the directory it was saved to)."""
    paths = {}

    def get(name: str):
        if name not in paths:
            hf = tiny_hf_bamba(seed=0) if name == "bamba" else hf_model(name)
            path = tmp_path_factory.mktemp(name)
            hf.save_pretrained(str(path))
            paths[name] = (hf, str(path))
        return paths[name]

    return get


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_bf16_logits_within_bf16s_own_error_of_transformers(name, state_dtype, saved):
    hf32, path = saved(name)
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    cfg, ours, _ = load_model(path, dtype=torch.bfloat16)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    a, b = _tokens(40, 2), _tokens(30, 3)
    buffers = LayerBuffers.allocate(
        cfg, 2, KV, dtype=torch.bfloat16, state_dtype=state_dtype
    )  # KV in the weights' dtype, as --kv-dtype auto
    with torch.no_grad():
        first = ours.forward_extend(a, 0, 1, torch.arange(40), buffers, all_logits=True)
        second = ours.forward_extend(b, 40, 1, torch.arange(70), buffers, all_logits=True)
        got = torch.cat([first, second]).float()
        want = hf16(torch.cat([a, b])[None]).logits[0].float()
        exact = hf32(torch.cat([a, b])[None]).logits[0].float()
    bf16_error = (want - exact).abs().max().item()
    ours_error = (got - want).abs().max().item()
    assert ours_error <= bf16_error + 0.01, (ours_error, bf16_error)
    assert (got - exact).abs().max().item() <= 2 * bf16_error + 0.01


def _bf16_engine(state_dtype: str = "float32", max_parked: int = 0):
    pools = PoolConfig(
        max_sessions=2,
        kv_tokens=512,
        max_context=256,
        page_size=1,
        state_dtype=state_dtype,
        max_parked_sessions=max_parked,
    )
    return make_engine(pools, load("tiny-bamba", dtype=torch.bfloat16))


def test_pools_parking_and_moves_follow_the_dtypes():
    engine = _bf16_engine(max_parked=2)
    f32 = make_engine(PoolConfig(max_sessions=2, kv_tokens=512, max_context=256, page_size=1))
    assert engine.config.pools.kv_dtype == "bfloat16"  # auto: the weights' dtype
    gpu, host = engine.pool, engine.sessions.residency.parker.host
    assert gpu.kv_pool.k_all.dtype == host.kv.k_all.dtype == torch.bfloat16
    assert gpu.mamba_pool.ssm_all.dtype == host.mamba.ssm_all.dtype == torch.float32
    assert gpu.kv_pool.k_all.nbytes * 2 == f32.pool.kv_pool.k_all.nbytes
    assert gpu.mamba_pool.ssm_all.nbytes == f32.pool.mamba_pool.ssm_all.nbytes
    engine.open_session("s")
    run_turn(engine, "s", token_ids(20, 1), greedy(4))
    _, record = engine.moves.export(["s"])
    committed = record.sessions[0].committed_len
    assert (record.state_dtype, record.kv_dtype) == ("torch.float32", "torch.bfloat16")
    assert record.k.nbytes == f32.pool.kv_pool.k_all[:, :committed].nbytes // 2
    engine.moves.finish(["s"], moved=False)
    close_and_check(engine)
    close_and_check(f32)


def test_state_of_other_dtypes_is_refused_on_import():
    source, same, other = _bf16_engine(), _bf16_engine(), _bf16_engine(state_dtype="bfloat16")
    assert source.fingerprint == other.fingerprint  # the same model: only the dtypes differ
    source.open_session("s")
    prompt = token_ids(12, 4)
    run_turn(source, "s", prompt, greedy(3))
    _, record = source.moves.export(["s"])
    with pytest.raises(IncompatibleStateError) as refused:
        other.moves.import_([record])
    assert refused.value.code == StatusCode.FAILED_PRECONDITION
    assert "torch.float32/torch.bfloat16" in str(refused.value)
    assert_engine_at_capacity(other)
    imported = same.moves.import_([record])
    assert [i.session_id for i in imported.opened] == ["s"] and not imported.refused
    source.moves.finish(["s"], moved=False)
    more = token_ids(5, 5)
    assert run_turn(same, "s", more, greedy(4))[0] == run_turn(source, "s", more, greedy(4))[0]
    for engine in (source, same, other):
        close_and_check(engine)


def test_the_flags_reach_the_engine_a_replica_builds():
    parser = argparse.ArgumentParser()
    add_arguments(parser, ServeConfig)
    argv = ["--dtype", "bfloat16", "--state-dtype", "bfloat16", "--kv-dtype", "float16"]
    config = from_arguments(ServeConfig, parser.parse_args(argv)).replica
    engine = build_engine(config)  # as ReplicaActor builds it: load(..., dtype=weights_dtype)
    assert engine.runner.model.embed_tokens.weight.dtype == torch.bfloat16
    assert engine.pool.mamba_pool.ssm_all.dtype == torch.bfloat16
    assert engine.pool.kv_pool.k_all.dtype == torch.float16
    with pytest.raises(ValueError, match="state_dtype"):
        PoolConfig(state_dtype="float64")
