"""``DecodeShapes``: the sizes a decode batch is padded to, so that every step runs one of a few
fixed shapes (what CUDA graphs need: a captured graph replays one shape).

A batch of ``n`` rows is padded to the smallest bucket that holds it (1, 2, 4, 8, then multiples
of 8 up to the replica's rows), and the KV columns its rows read to the smallest power of two of
at least ``min_width`` that holds its longest row (at most the context). Padding rows read and
write the pools' scratch entries; padding columns are masked out. ``exact`` pads nothing: the
CPU's default, where padding would only cost.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeShapes:
    batches: tuple[int, ...]  # the batch sizes a step runs, ascending (empty: exact)
    max_width: int  # KV columns a row can read: the context
    min_width: int = 0  # the narrowest padded KV width (0: exact)

    @classmethod
    def exact(cls, max_width: int) -> DecodeShapes:
        return cls((), max_width)

    @classmethod
    def padded(cls, max_rows: int, max_width: int, min_width: int = 64) -> DecodeShapes:
        """Buckets for batches of up to ``max_rows`` rows reading up to ``max_width`` columns."""
        sizes = {b for b in (1, 2, 4) if b < max_rows} | set(range(8, max_rows, 8)) | {max_rows}
        return cls(tuple(sorted(sizes)), max_width, min(min_width, max_width))

    @property
    def pads(self) -> bool:
        return bool(self.batches)

    def batch(self, rows: int) -> int:
        """The batch size a step of ``rows`` rows runs."""
        if not self.batches:
            return rows
        i = bisect.bisect_left(self.batches, rows)
        if i == len(self.batches):
            raise ValueError(f"a decode batch of {rows} rows, more than {self.batches[-1]}")
        return self.batches[i]

    def width(self, columns: int) -> int:
        """The KV columns a step reads whose longest row reads ``columns``."""
        if not self.batches:
            return columns
        if columns > self.max_width:
            raise ValueError(f"{columns} KV columns, more than the context ({self.max_width})")
        width = self.min_width
        while width < columns:
            width *= 2
        return min(width, self.max_width)
