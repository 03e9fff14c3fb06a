"""One workload for the recurrent mixers' kernel tests (tests/gpu/test_kernels.py on CUDA,
tests/test_triton_kernels.py in Triton's interpreter): a padded batched prefill with one row
continuing from saved state, then decode steps."""

from __future__ import annotations

import torch

from replica.model import LayerBuffers


def run_workload(
    model, cfg, dtype: torch.dtype, device: str, lengths=(3, 70, 130), steps: int = 6
) -> tuple[torch.Tensor, LayerBuffers]:
    """Rows of ``lengths`` new tokens (the first after a 20-token prefix), then ``steps`` decode
    steps of the three rows; the logits of every forward and the buffers (state) after them."""
    gen = torch.Generator().manual_seed(0)
    buffers = LayerBuffers.allocate(cfg, 4, 1024, dtype=dtype, device=torch.device(device))
    mamba = torch.tensor([3, 0, 1])
    model.forward_extend(
        torch.randint(0, 256, (20,), generator=gen), 0, 3, torch.arange(20), buffers
    )
    starts = [20, 0, 0]
    slots = [
        torch.cat([torch.arange(20), torch.arange(100, 109)]),
        torch.arange(300, 376),
        torch.arange(600, 736),
    ]
    ids = [torch.randint(0, 256, (n,), generator=gen) for n in lengths]
    kv = [s[: start + n] for s, start, n in zip(slots, starts, lengths)]
    logits = [model.forward_extend_batch(ids, starts, mamba, kv, buffers)]
    table = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    pos = torch.tensor([start + n for start, n in zip(starts, lengths)])
    for step in range(steps):
        tokens = torch.randint(0, 256, (3,), generator=gen)
        logits.append(
            model.forward_decode(tokens, pos + step, mamba, table, pos + step + 1, buffers)
        )
    return torch.cat(logits).float().cpu(), buffers
