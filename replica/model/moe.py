"""A routed mixture of experts with an optional shared expert (Granite, Nemotron-H, Qwen3-Next).

Expert weights are stacked: ``gate_up [experts, 2*inter (or inter), hidden]`` and
``down [experts, hidden, inter]``. Each token's output is the weighted sum of its top-k experts
(added in expert order), plus the shared expert's output. Tokens are grouped by expert with one
sort, and the experts' blocks of rows run as one grouped GEMM (on CUDA where the build's grouped
GEMM takes the dtype, e.g. bfloat16 on recent GPUs; elsewhere on CUDA one matmul per expert that
has tokens), so the work is proportional to the tokens routed, not to the number of experts. The
grouped GEMM reads its block sizes on the device: a forward that uses it makes no host round
trip, so a CUDA graph can record it.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from replica.model.config_parts import MoEConfig
from replica.model.mlp import MLP, activation


class MoE(nn.Module):
    """Parameters: ``router.weight``, ``score_bias`` (sigmoid router only), ``gate_up``, ``down``,
    ``shared.*`` and ``shared_gate.weight`` when the config has them."""

    def __init__(self, hidden_size: int, moe: MoEConfig, act: str, gated: bool, bias: bool) -> None:
        super().__init__()
        self.cfg = moe
        self.act = act
        self.gated = gated
        n, inter = moe.num_experts, moe.intermediate_size
        self.router = nn.Linear(hidden_size, n, bias=False)
        if moe.router == "sigmoid":
            # a checkpoint tensor, used for choosing experts only; never trained here
            self.score_bias = nn.Parameter(torch.zeros(n), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(n, (2 if gated else 1) * inter, hidden_size))
        self.down = nn.Parameter(torch.empty(n, hidden_size, inter))
        self.shared = None
        self.shared_gate = None
        if moe.shared_intermediate_size:
            self.shared = MLP(hidden_size, moe.shared_intermediate_size, act, gated, bias)
        if moe.shared_expert_gate:
            self.shared_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert weights (in ``x``'s dtype) and indices, both ``[N, k]``, of ``x [N, H]``."""
        cfg = self.cfg
        logits = F.linear(x, self.router.weight).float()
        if cfg.router == "softmax":
            weights, idx = torch.softmax(logits, dim=-1).topk(cfg.top_k, dim=-1)
            if cfg.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
        else:
            scores = logits.sigmoid()
            choice = scores + self.score_bias.float()
            if cfg.n_group > 1:
                groups = choice.view(x.shape[0], cfg.n_group, -1)
                best = groups.topk(2, dim=-1)[0].sum(-1).topk(cfg.topk_group, dim=-1)[1]
                keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best, True)
                choice = groups.masked_fill(~keep[..., None], -torch.inf).view_as(choice)
            idx = choice.topk(cfg.top_k, dim=-1)[1]
            weights = scores.gather(1, idx)
            if cfg.norm_topk_prob:
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * cfg.routed_scaling_factor
        return weights.to(x.dtype), idx

    def experts(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Weighted sum over each token's chosen experts; ``x [N, H]``."""
        top_k = idx.shape[1]
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // top_k
        counts = torch.bincount(flat, minlength=self.gate_up.shape[0])
        rows = x.index_select(0, token)  # grouped by expert, in expert order
        if grouped_gemm(x.device, x.dtype):
            # one grouped GEMM over every expert's block of rows: the same products as a matmul
            # per expert (bit for bit), without a Python loop over the experts
            offs = counts.cumsum(0).to(torch.int32)
            h = self._activate(F.grouped_mm(rows, self.gate_up.transpose(1, 2), offs=offs))
            routed = F.grouped_mm(h, self.down.transpose(1, 2), offs=offs)
        else:  # a matmul per expert, its rows counted on the host
            outs = []
            start = 0
            for e, count in enumerate(counts.tolist()):
                if count:
                    h = self._activate(F.linear(rows[start : start + count], self.gate_up[e]))
                    outs.append(F.linear(h, self.down[e]))
                    start += count
            routed = torch.cat(outs)
        routed = routed * weights.reshape(-1).index_select(0, order)[:, None]
        return torch.zeros_like(x).index_add_(0, token, routed)

    def _activate(self, h: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return activation(self.act, gate) * up
        return activation(self.act, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, idx = self.route(flat)
        out = self.experts(flat, weights, idx)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(shape)


@cache
def grouped_gemm(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``F.grouped_mm`` runs on ``device`` in ``dtype``: always on the CPU; on CUDA as
    the build and the GPU allow (bfloat16 on recent GPUs), found by trying it once."""
    if device.type == "cpu":
        return True
    try:  # as ``MoE.experts`` calls it: stacked weights transposed, an expert without rows
        rows = torch.zeros((4, 16), dtype=dtype, device=device)
        weights = torch.zeros((2, 32, 16), dtype=dtype, device=device).transpose(1, 2)
        for ends in ([1, 4], [0, 4]):
            F.grouped_mm(rows, weights, offs=torch.tensor(ends, dtype=torch.int32, device=device))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True
