"""``bench.state_update``'s two CUDA variants (the kernels in place by slot, and on a gathered copy
written back) do the same work: run here on the PyTorch path, each changes the batch's slots the
same way, and no other, with the same output."""

from __future__ import annotations

import pytest
import torch

from bench.state_update import kernel_variants
from replica.model import LayerBuffers, build_tiny


@pytest.mark.parametrize("name", ["tiny-bamba", "tiny-qwen3-next"])
def test_in_place_and_on_a_copy_change_the_same_slots_alike(name):
    cfg, model, _ = build_tiny(name)
    layer = next(la for la in model.layers if la.mamba is not None or la.deltanet is not None)
    mixer = layer.mamba if layer.mamba is not None else layer.deltanet
    gen = torch.Generator().manual_seed(0)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=8, kv_token_slots=1)
    for t in (buffers.conv[0], buffers.ssm[0]):
        t.copy_(torch.randn(t.shape, generator=gen))
    before = [buffers.conv[0].clone(), buffers.ssm[0].clone()]
    order = torch.tensor([6, 1, 3])
    h = torch.randn(3, cfg.hidden_size, generator=gen)
    results = {}
    with torch.inference_mode():
        for in_place in (True, False):
            conv, ssm = before[0].clone(), before[1].clone()
            out = kernel_variants(mixer, h, conv, ssm, order)[in_place]()
            results[in_place] = (out, conv, ssm)
    (out, conv, ssm), (want_out, want_conv, want_ssm) = results[True], results[False]
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(conv, want_conv)
    torch.testing.assert_close(ssm, want_ssm)
    others = [0, 2, 4, 5, 7]
    assert torch.equal(ssm[others], before[1][others]) and torch.equal(
        conv[others], before[0][others]
    )
    assert not torch.equal(ssm[order], before[1][order])
