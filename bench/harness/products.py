"""The products of a model step alone: a floor under the step's time that any implementation
running the same products on the same math library pays.

``record_products(fn)`` runs ``fn`` (e.g. one engine step) under a dispatch mode that notes each
product op it calls (linear layers, matrix and batched matrix products, grouped expert GEMMs,
scaled dot-product attention) with its arguments: parameters by reference, so that a replay
reads the same weights from the same memory, every other tensor cloned as it was at the call.
``Products.seconds`` replays those ops alone, in order, and gives the best time of some rounds:
the step's time less everything that is not a product (norms, gates, state updates, sampling,
bookkeeping). ``step / products`` is how much of a step is beyond its products, and ``theirs /
products`` the most any speed-up of everything else could give over ``theirs``. ``StepFloor``
holds one step's figures as a bench prints them, with ``small_op_seconds``, what one small op
costs (the other ops' dispatch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# top-level ops as the dispatcher sees them: under inference mode composite ops (linear,
# matmul, attention) arrive whole, under autograd decomposed into mm / addmm / bmm
PRODUCT_OPS = frozenset(
    {
        aten.linear.default,
        aten.matmul.default,
        aten.mm.default,
        aten.addmm.default,
        aten._foreach_mm.default,  # a Mamba2 layer's read of its rows' states, one call
        aten.bmm.default,
        aten.baddbmm.default,
        aten._grouped_mm.default,
        aten.scaled_dot_product_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
    }
)

Call = tuple[Any, list[Any], dict[str, Any]]


@dataclass
class Products:
    """The product ops one call of a function made, ready to replay; ``others``: how many ops
    that are not products it made."""

    calls: list[Call] = field(default_factory=list)
    others: int = 0

    def seconds(self, rounds: int, clock: Callable[[], float]) -> float:
        """The best time of ``rounds`` replays of every product, in order (after one warm-up)."""
        best = float("inf")
        with torch.inference_mode():
            for i in range(rounds + 1):
                start = clock()
                for op, args, kwargs in self.calls:
                    op(*args, **kwargs)
                if i:
                    best = min(best, clock() - start)
        return best


class _Recorder(TorchDispatchMode):
    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self.weights = weights  # the parameters' storages
        self.products = Products()

    def _kept(self, value: Any) -> Any:
        """A view of a parameter (an expert's slice, a transpose) as it is; any other tensor as
        it is now, so that a later in-place update does not reach the replay."""
        if isinstance(value, torch.Tensor) and _storage(value) not in self.weights:
            return value.clone()
        return value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCT_OPS:
            self.products.calls.append(
                (
                    func,
                    [self._kept(a) for a in args],
                    {k: self._kept(v) for k, v in kwargs.items()},
                )
            )
        else:
            self.products.others += 1
        return func(*args, **kwargs)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def record_products(model: torch.nn.Module, fn: Callable[[], Any]) -> Products:
    """The products ``fn()`` makes; ``model``'s parameters (and views of them) are kept by
    reference."""
    with _Recorder({_storage(p) for p in model.parameters()}) as recorder:
        fn()
    return recorder.products


@dataclass(frozen=True)
class StepFloor:
    """One decode step of a batch of sessions, in seconds: ours, its products alone (and how
    many other ops it ran), and transformers'."""

    ours: float
    products: float
    other_ops: int
    theirs: float

    def cells(self, op_seconds: float) -> list[str]:
        """``op_seconds``: one small op's cost (``small_op_seconds``)."""
        return [
            f"{self.ours * 1e3:.2f}",
            f"{self.products * 1e3:.2f} ({self.products / self.ours:.0%})",
            f"{self.other_ops}",
            f"{self.other_ops * op_seconds * 1e3:.2f}",
            f"{self.theirs * 1e3:.2f}",
            f"{self.theirs / self.ours:.2f}x",
            f"{self.theirs / self.products:.2f}x",
        ]


def small_op_seconds(device: str, clock: Callable[[], float], calls: int = 2000) -> float:
    """What one op on a 16-element tensor costs (the dispatcher, an allocation): best of 5."""
    x = torch.ones(16, device=device)
    best = float("inf")
    for _ in range(5):
        start = clock()
        for _ in range(calls):
            x.mul(1.0)
        best = min(best, clock() - start)
    return best / calls
