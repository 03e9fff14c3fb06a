"""Printing: aligned tables, ratios and goals (met / not met)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness.stats import Spread


def number(value: float, spec: str = ".2f") -> str:
    """``value`` formatted by ``spec``, ``-`` when it is NaN (nothing measured)."""
    return "-" if math.isnan(value) else f"{value:{spec}}"


def ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` to two decimals, ``-`` when either is missing or 0."""
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return "-"
    return f"{numerator / denominator:.2f}"


class Table:
    """An aligned text table, each column as wide as its widest cell: columns of figures are
    right-aligned, columns of words left-aligned. Cells are printed as given (format numbers
    before adding them)."""

    def __init__(self, *headers: str) -> None:
        self.headers = headers
        self.rows: list[tuple[str, ...]] = []

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{len(cells)} cells for {len(self.headers)} columns")
        self.rows.append(tuple(str(cell) for cell in cells))

    def print(self, indent: str = "  ") -> None:
        widths = [
            max(len(row[i]) for row in (self.headers, *self.rows)) for i in range(len(self.headers))
        ]

        right = [all(_is_figure(row[i]) for row in self.rows) for i in range(len(widths))]

        def line(row: Sequence[str]) -> str:
            cells = [
                cell.rjust(width) if r else cell.ljust(width)
                for cell, width, r in zip(row, widths, right)
            ]
            return indent + "  ".join(cells).rstrip()

        print(line(self.headers))
        print(indent + "-" * (sum(widths) + 2 * (len(widths) - 1)))
        for row in self.rows:
            print(line(row))


def _is_figure(cell: str) -> bool:
    return cell[:1] in tuple("0123456789-+.")


@dataclass(frozen=True)
class Goal:
    """A target for one measured figure; met when the median over repetitions is at least
    (``at_least``) or below the target."""

    name: str
    measured: Spread
    target: float
    at_least: bool = True
    unit: str = ""
    spec: str = ".2f"

    @property
    def met(self) -> bool:
        if self.at_least:
            return self.measured.median >= self.target
        return self.measured.median < self.target

    @property
    def target_text(self) -> str:
        return f"{'>=' if self.at_least else '<'} {self.target:g}{self.unit}"


def print_goals(goals: Sequence[Goal]) -> None:
    """The goals as a table: measured median (min–max over repetitions), target, met or not."""
    table = Table("goal", "measured", "target", "met")
    for goal in goals:
        table.add(
            goal.name,
            goal.measured.format(goal.spec, goal.unit),
            goal.target_text,
            "yes" if goal.met else "NOT met",
        )
    print("\ngoals (median over repetitions, min–max in brackets)")
    table.print()
