"""Paired measurements: ours and the baseline side by side, and their verdict.

Owns how a benchmark turns interleaved samples into one row: both sides are
up at once and measured in alternation (request by request, or in small
blocks, the side that goes first swapped every round), each round gives one
ratio, and the row reports the median of those ratios with their
interquartile range. Drift on the machine (other processes on a shared
core, frequency changes, garbage collection) then falls on both sides of a
round alike instead of on one side of the run, so two runs on the same
machine agree within a few percent.

It also owns the targets' notation (``"<= 1.10"``, ``">= 0.98"``) and the
compact table of (metric, ratio, spread, target, met) that every benchmark
prints for ``docs/performance.md``. Targets are printed, never asserted: a
missed one is information, not a failure. Correctness rows (``ok``: nothing
lost, recall, the soak's reconciliation) are the opposite: ``failed`` names
them, and every entry point exits non-zero on one, ``--quick`` included.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Spread",
    "failed",
    "met",
    "spread",
    "table",
    "target_rows",
    "target_table",
]


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of per-round values and their interquartile range."""

    median: float
    q1: float
    q3: float
    rounds: int

    def __str__(self) -> str:
        return f"{_num(self.q1)}–{_num(self.q3)}"


def spread(values: Iterable[float]) -> Spread:
    """Median and interquartile range of ``values`` (at least one)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    if len(ordered) < 4:
        return Spread(statistics.median(ordered), ordered[0], ordered[-1], len(ordered))
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Spread(statistics.median(ordered), q1, q3, len(ordered))


def met(value: float, target: str) -> bool:
    """Whether ``value`` meets ``target`` (``"<= x"`` or ``">= x"``)."""
    operator, _, bound = target.partition(" ")
    limit = float(bound.lstrip("+"))
    if operator == "<=":
        return value <= limit
    if operator == ">=":
        return value >= limit
    raise ValueError(f"target must be '<= x' or '>= x', got {target!r}")


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def target_rows(rows: Sequence[dict[str, object]]) -> list[tuple[str, ...]]:
    """(metric, ratio, spread, target, met) of every row that has a target."""
    table = []
    for row in rows:
        target = row.get("target")
        if target is None:
            continue
        value = row.get("ratio")
        table.append(
            (
                str(row["benchmark"]),
                "–" if value is None else _num(float(value)),  # type: ignore[arg-type]
                str(row.get("spread") or "–"),
                str(target),
                {True: "yes", False: "NO", None: "–"}[row.get("met")],  # type: ignore[index]
            )
        )
    return table


def target_table(rows: Sequence[dict[str, object]], *, markdown: bool = False) -> str:
    """The compact table of ``target_rows``, aligned or as Markdown."""
    header = ("metric", "ratio", "spread (IQR)", "target", "met")
    return table(
        header, target_rows(rows), markdown=markdown, rule="|---|---:|---:|---:|:-:|"
    )


def table(
    header: Sequence[str],
    body: Sequence[Sequence[str]],
    *,
    markdown: bool = False,
    rule: str | None = None,
) -> str:
    """``body`` under ``header``: columns aligned by spaces, or a Markdown
    table (``rule``: its alignment row, default left-aligned)."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", rule or "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        for cells in body
    ]
    return "\n".join(lines)


def failed(rows: Iterable[dict[str, object]]) -> list[str]:
    """The benchmarks of the correctness rows that failed (``ok`` False)."""
    return [str(row.get("benchmark")) for row in rows if row.get("ok") is False]
