"""The pools on a GPU: the host tier and the state copier's staging buffer are pinned (so copies
to and from the GPU are DMAs), and bf16 state of slots larger than the 32 MiB staging buffer is
copied bit for bit both ways, by the direct path and by the staged one (the buffer grows to one
slot of every layer). The copies also run on the CPU, the pinning checks only on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from replica.config import PoolConfig
from replica.pools.state_copy import CUDA_STAGING_BYTES, StateCopier
from tests.support.engine import close_and_check, greedy, make_engine, run_turn, token_ids

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device: pinned memory is CUDA's")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

# 4 layers x 9 MiB of bf16 state a slot: 36 MiB a slot, more than the 32 MiB staging buffer.
LAYERS, SLOTS, STATE = 4, 6, (4096, 1152)


@needs_cuda
def test_host_pools_and_the_staging_buffer_are_pinned(monkeypatch):
    monkeypatch.setenv("SESSION_ROUTER_TEST_DEVICE", "cuda")
    pools = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, max_parked_sessions=4)
    engine = make_engine(pools)
    assert engine.pool.mamba_pool.ssm_all.is_cuda and engine.pool.kv_pool.k_all.is_cuda
    parker = engine.sessions.residency.parker
    host = parker.host
    for t in (host.mamba.conv_all, host.mamba.ssm_all, host.kv.k_all, host.kv.v_all):
        assert t.device.type == "cpu" and t.is_pinned()
    assert parker.copier.staging.is_pinned()
    assert engine.transfer.copier.staging.is_pinned()
    assert parker.copier.staging.numel() == CUDA_STAGING_BYTES
    engine.open_session("s")
    run_turn(engine, "s", token_ids(40, 1), greedy(4))
    close_and_check(engine)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_slots_over_32_mib_copy_exactly_both_ways(device, direct):
    cuda = device == "cuda"
    copier = StateCopier(cuda=cuda, direct_bytes=None if direct else 1 << 40)
    gen = torch.Generator().manual_seed(0)
    gpu = torch.randn((LAYERS, SLOTS, *STATE), generator=gen).to(torch.bfloat16).to(device)
    host = torch.zeros((LAYERS, SLOTS, *STATE), dtype=torch.bfloat16, pin_memory=cuda)
    slot_bytes = LAYERS * STATE[0] * STATE[1] * 2
    assert slot_bytes > CUDA_STAGING_BYTES
    src, dst = torch.tensor([5, 0, 3, 4]), torch.tensor([1, 2, 4, 5])
    assert copier.copy(gpu, src, host, dst) == 4 * slot_bytes
    assert torch.equal(host[:, dst], gpu[:, src].cpu())
    assert not host[:, [0, 3]].any()
    back = torch.zeros_like(gpu)
    copier.copy(host, dst, back, src)
    assert torch.equal(back[:, src], gpu[:, src]) and not back[:, [1, 2]].any()
    if not direct:
        assert copier.staging.numel() >= slot_bytes  # grew to one slot of every layer
