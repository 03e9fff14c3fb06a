"""``DecodeGraphs``: the decode step as CUDA graphs, one per padded shape, recorded when a step
first needs it.

A graph replays the kernels of one ``forward_decode`` of a fixed batch size and KV width
(``DecodeShapes``) on fixed input tensors: a step copies its token ids, positions, mamba slots
and KV table into them, replays, and reads the logits from the graph's output, which the next
replay overwrites. A graph is recorded (``CudaRecorder``) on padding rows only, which read and
write the pools' scratch entries, so no session's state moves; the recurrent layers update the
state in place, and their padding rows leave the scratch slot's temporal state as it was. Each
recorded graph is then checked against the eager forward on other padding-only inputs of its
shape, from the same scratch state; a capture that fails or does not match turns the graphs off
for the replica (logged once): every later step runs eagerly, as without graphs.

Only where a decode forward makes no host round trip: CUDA, and MoE layers only where their
experts run as one grouped GEMM (``replica.model.moe.grouped_gemm``: bfloat16 on recent GPUs;
otherwise they count each expert's rows on the host). Owned by the ``ModelRunner``, on the
engine thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from replica.engine.decode_shapes import DecodeShapes
from replica.model import HybridModel
from replica.model.moe import grouped_gemm
from replica.pools.hybrid_pool import HybridReqToTokenPool

log = logging.getLogger(__name__)


class Graph(Protocol):
    def replay(self) -> None: ...


# records a forward as a graph: the graph, and the output tensor each replay rewrites
Recorder = Callable[[Callable[[], torch.Tensor]], tuple[Graph, torch.Tensor]]


class CudaRecorder:
    """Captures a forward as a CUDA graph, after two runs outside it on a side stream (cuBLAS
    and the Triton kernels set themselves up); the graphs share one memory pool."""

    def __init__(self) -> None:
        self.memory = torch.cuda.graph_pool_handle()

    def __call__(self, forward: Callable[[], torch.Tensor]) -> tuple[Graph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread-local: the replica's other threads may use CUDA meanwhile (not captured)
        with torch.cuda.graph(graph, pool=self.memory, capture_error_mode="thread_local"):
            logits = forward()
        return graph, logits


class DecodeGraphs:
    def __init__(
        self,
        model: HybridModel,
        pool: HybridReqToTokenPool,
        shapes: DecodeShapes,
        record: Recorder | None = None,
    ) -> None:
        """``record``: how a forward becomes a graph (a ``CudaRecorder`` unless given)."""
        device = pool.req_to_token.device
        rows, width = shapes.batches[-1], shapes.max_width
        self.model, self.buffers = model, pool.buffers
        self.scratch_slot = pool.mamba_pool.scratch_slot
        self.scratch_token = pool.kv_pool.scratch_slot
        # the graphs' inputs: a graph of ``b`` rows and ``w`` columns reads ``[:b]``, ``[:b, :w]``
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)
        self.kv = torch.zeros((rows, width), dtype=pool.req_to_token.dtype, device=device)
        self.graphs: dict[tuple[int, int], tuple[Graph, torch.Tensor]] = {}
        self.record = record or CudaRecorder()
        self.off: str | None = None  # why the graphs were turned off

    @classmethod
    def build(
        cls, model: HybridModel, pool: HybridReqToTokenPool, shapes: DecodeShapes, enabled: bool
    ) -> DecodeGraphs | None:
        """Graphs for ``model``'s decode steps on ``pool``, or None where they cannot run."""
        if not enabled or pool.req_to_token.device.type != "cuda":
            return None
        if "moe" in model.cfg.layer_ffns and not grouped_gemm(model.device, model.dtype):
            log.info("decode runs eagerly: the MoE layers count their experts' rows on the host")
            return None
        return cls(model, pool, shapes)

    def serves(self) -> bool:
        return self.off is None

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        """``forward_decode`` of a padded batch (``kv [rows, width]`` a shape of the
        ``DecodeShapes``) by its graph, captured now if need be; the logits ``[rows, vocab]``
        are valid until the next call. Eager when the capture fails (graphs off from then on)."""
        rows, width = kv.shape
        entry = self.graphs.get((rows, width)) or self._capture(rows, width)
        if entry is None:
            return self._eager(ids.to(kv.device), positions, slots, kv)
        self.ids[:rows].copy_(ids, non_blocking=True)
        self.positions[:rows].copy_(positions)
        self.slots[:rows].copy_(slots)
        self.kv[:rows, :width].copy_(kv)
        graph, logits = entry
        graph.replay()
        return logits

    def _eager(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return self.model.forward_decode(
            ids, positions, slots, kv, positions + 1, self.buffers, padding_slot=self.scratch_slot
        )

    def _inputs(self, rows: int, width: int) -> tuple[torch.Tensor, ...]:
        return self.ids[:rows], self.positions[:rows], self.slots[:rows], self.kv[:rows, :width]

    def _padding(self, rows: int, width: int, token: int, position: int) -> None:
        """Every row of the ``rows x width`` inputs a padding row: the scratch slots, ``token``
        at ``position`` (every row the same, so their writes to the scratch slots agree)."""
        self.ids[:rows] = token
        self.positions[:rows] = min(position, width - 1)
        self.slots[:rows] = self.scratch_slot
        self.kv[:rows, :width] = self.scratch_token

    def _capture(self, rows: int, width: int) -> tuple[Graph, torch.Tensor] | None:
        if self.off is not None:
            return None
        try:
            inputs = self._inputs(rows, width)
            self._padding(rows, width, token=0, position=0)
            graph, logits = self.record(lambda: self._eager(*inputs))
            self._check(graph, logits, rows, width)
        except Exception as exc:  # noqa: BLE001 - any failure: the steps run eagerly
            self.off = f"{type(exc).__name__}: {exc}"
            log.error("CUDA graphs off, decode runs eagerly: %s x %s: %s", rows, width, self.off)
            return None
        self.graphs[(rows, width)] = (graph, logits)
        log.info("captured the decode step of %s rows x %s KV columns", rows, width)
        return graph, logits

    def _check(self, graph: Graph, logits: torch.Tensor, rows: int, width: int) -> None:
        """Raise unless a replay gives the eager forward's logits, on inputs other than the
        capture's, from the same scratch state."""
        vocab = self.model.cfg.vocab_size
        self._padding(rows, width, token=(rows * 7 + width) % vocab, position=width // 2)
        scratch = self._scratch_state()
        want = self._eager(*self._inputs(rows, width)).clone()
        self._restore(scratch)
        graph.replay()
        got = logits.clone()
        self._restore(scratch)
        # a graph that baked its capture's inputs is off by the logits' own scale; kernels that
        # round differently inside a graph by far less (half precision: a few parts in a 1000)
        error = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
        bound = 1e-3 if self.model.dtype == torch.float32 else 5e-2
        if not error <= bound:  # NaN too
            raise AssertionError(f"replay differs from eager: {error:.2g} of the logits' scale")

    def _scratch_state(self) -> list[torch.Tensor]:
        b = self.buffers
        return [t[self.scratch_slot].clone() for t in (*b.conv, *b.ssm)] + [
            t[self.scratch_token].clone() for t in (*b.k, *b.v)
        ]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        b = self.buffers
        slots = [self.scratch_slot] * (len(b.conv) + len(b.ssm))
        slots += [self.scratch_token] * (len(b.k) + len(b.v))
        for t, slot, value in zip((*b.conv, *b.ssm, *b.k, *b.v), slots, saved, strict=True):
            t[slot].copy_(value)
