"""Our Bamba against transformers' ``BambaForCausalLM`` on the same (tiny, random) weights."""

from __future__ import annotations

import pytest
import torch

from replica.model import LayerBuffers, load_model
from tests.support.hf_peer import VOCAB, tiny_hf_bamba


@pytest.fixture(scope="module", params=[(1, False), (2, True)], ids=["g1", "g2-tied"])
def pair(request, tmp_path_factory):
    n_groups, tied = request.param
    hf = tiny_hf_bamba(n_groups, tied, seed=n_groups)
    path = tmp_path_factory.mktemp(f"bamba-{n_groups}")
    hf.save_pretrained(str(path))
    cfg, ours, _ = load_model(str(path))
    assert cfg.mamba_n_groups == n_groups and cfg.tie_word_embeddings == tied
    assert cfg.mamba_chunk_size == 16 and cfg.partial_rotary_factor == 0.5
    return hf, cfg, ours


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_prompt_logits_match(pair):
    hf, cfg, ours = pair
    ids = _tokens(40, 1)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=3, kv_token_slots=64)
    kv = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:40]
    got = ours.forward_extend(ids, 0, 2, kv, buffers, all_logits=True)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert got.shape == (40, VOCAB)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    last = ours.forward_extend(ids, 0, 1, kv, buffers)
    torch.testing.assert_close(last, want[-1:], atol=1e-4, rtol=0)


def test_two_turns_match_one_pass(pair):
    hf, cfg, ours = pair
    a, b = _tokens(23, 2), _tokens(17, 3)
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2, kv_token_slots=64)
    kv = torch.arange(10, 50)
    first = ours.forward_extend(a, 0, 1, kv[:23], buffers, all_logits=True)
    second = ours.forward_extend(b, 23, 1, kv, buffers, all_logits=True)
    full = torch.cat([a, b])
    with torch.no_grad():
        want = hf(full[None]).logits[0]
    torch.testing.assert_close(torch.cat([first, second]), want, atol=1e-4, rtol=0)

    # transformers continuing from its own cache agrees too (positions passed explicitly)
    with torch.no_grad():
        out = hf(a[None], use_cache=True)
        cont = hf(
            b[None], cache=out.cache, use_cache=True, position_ids=torch.arange(23, 40)[None]
        ).logits[0]
    torch.testing.assert_close(second, cont, atol=1e-4, rtol=0)


def test_greedy_decode_matches_generate(pair):
    hf, cfg, ours = pair
    prompt, new = _tokens(12, 4), 16
    with torch.no_grad():
        gen = hf.generate(
            prompt[None],
            max_new_tokens=new,
            do_sample=False,
            attention_mask=torch.ones(1, 12, dtype=torch.long),
        )
    want = gen[0, 12:].tolist()
    assert len(want) == new

    buffers = LayerBuffers.allocate(cfg, mamba_slots=4, kv_token_slots=128)
    slots = torch.randperm(128, generator=torch.Generator().manual_seed(5))[: 12 + new]
    logits = ours.forward_extend(prompt, 0, 3, slots[:12], buffers)
    got = [int(logits.argmax(-1))]
    row = slots[None].clone()
    for step in range(new - 1):
        pos = 12 + step
        logits = ours.forward_decode(
            torch.tensor([got[-1]]),
            torch.tensor([pos]),
            torch.tensor([3]),
            row,
            torch.tensor([pos + 1]),
            buffers,
        )
        got.append(int(logits.argmax(-1)))
    assert got == want
