"""Each family's model against transformers' own implementation on the same tiny random weights
(loaded from the checkpoint transformers saved): the logits of a prompt, a second turn that
continues from the saved state, and padded batches whose padding must leave no trace."""

from __future__ import annotations

import pytest
import torch

from replica.model import LayerBuffers, load_model
from tests.models.peers import CONFIGS, FAMILIES, VOCAB, hf_model

KV = 160


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _hf_logits(name: str, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(name)(ids[None]).logits[0].float()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prompt_logits_match(name, peer_checkpoint):
    """70 tokens: several SSD chunks of 16 and two DeltaNet chunks of 64."""
    cfg, ours, _ = load_model(peer_checkpoint(name))
    ids = _tokens(70, 1)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=3, kv_token_slots=KV)
    kv = torch.randperm(KV, generator=torch.Generator().manual_seed(0))[:70]
    got = ours.forward_extend(ids, 0, 2, kv, buffers, all_logits=True)
    want = _hf_logits(name, ids)
    assert got.shape == (70, VOCAB)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        ours.forward_extend(ids, 0, 1, kv, buffers), want[-1:], atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_second_turn_continues_from_saved_state(name, peer_checkpoint):
    cfg, ours, _ = load_model(peer_checkpoint(name))
    a, b = _tokens(23, 2), _tokens(50, 3)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2, kv_token_slots=KV)
    kv = torch.arange(20, 93)
    first = ours.forward_extend(a, 0, 1, kv[:23], buffers, all_logits=True)
    second = ours.forward_extend(b, 23, 1, kv, buffers, all_logits=True)
    want = _hf_logits(name, torch.cat([a, b]))
    torch.testing.assert_close(torch.cat([first, second]), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_padded_batch_equals_each_row_alone(name, peer_checkpoint):
    """Rows of 1..70 tokens, fresh and continuing, batched with padding, against each row run
    alone from the same state; the slots of fresh rows hold garbage, which must be ignored."""
    cfg, ours, _ = load_model(peer_checkpoint(name))
    lengths, starts = [1, 9, 70, 33], [0, 5, 0, 40]
    gen = torch.Generator().manual_seed(4)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=5, kv_token_slots=2 * KV)
    for t in (*buffers.conv, *buffers.ssm, *buffers.k, *buffers.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    ids = [_tokens(n, 10 + i) for i, n in enumerate(lengths)]
    kv = [
        torch.arange(s + n) + KV * (i % 2) + 40 * (i // 2)
        for i, (s, n) in enumerate(zip(starts, lengths))
    ]
    slots = torch.tensor([4, 0, 2, 1])
    alone = LayerBuffers(*([t.clone() for t in ts] for ts in buffers))
    want = torch.cat(
        [ours.forward_extend(i, s, int(m), k, alone) for i, s, m, k in zip(ids, starts, slots, kv)]
    )
    got = ours.forward_extend_batch(ids, starts, slots, kv, buffers)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for kind, gs, ws in zip(("conv", "ssm", "k", "v"), buffers, alone):
        for g, w in zip(gs, ws):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4, msg=kind)
