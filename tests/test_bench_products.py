"""``bench.harness.products``: the products a call makes are recorded with their weights (and
views of them) by reference and everything else as it was, and replay alone, in order, to the
same results."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from bench.harness.products import record_products


def test_a_forward_records_its_products_and_replays_them_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    results = []

    def forward():
        with torch.inference_mode():
            h = model(x)
            q = h.view(1, 1, 3, 4)
            results.append(F.scaled_dot_product_attention(q, q, q))
            F.linear(x, model[0].weight[1:3])  # a view of a parameter (as an expert's slice)

    products = record_products(model, forward)
    ops = [op for op, _, _ in products.calls]
    assert ops == [
        torch.ops.aten.linear.default,
        torch.ops.aten.linear.default,
        torch.ops.aten.scaled_dot_product_attention.default,
        torch.ops.aten.linear.default,
    ]
    assert products.others >= 2  # the relu and the view
    _, first_args, _ = products.calls[0]
    assert products.calls[1][1][1] is model[2].weight
    assert first_args[1] is model[0].weight  # a weight by reference: the same memory read
    assert first_args[0] is not x and torch.equal(first_args[0], x)  # the input as it was
    x.zero_()
    assert not torch.equal(first_args[0], x)  # a clone: later writes do not reach it
    _, attn_args, _ = products.calls[2]
    with torch.inference_mode():
        assert torch.equal(torch.ops.aten.scaled_dot_product_attention(*attn_args), results[0])
    sliced = products.calls[3][1][1]  # the slice is read where it lives, not copied
    assert sliced.untyped_storage().data_ptr() == model[0].weight.untyped_storage().data_ptr()
    assert products.seconds(2, time.perf_counter) > 0
