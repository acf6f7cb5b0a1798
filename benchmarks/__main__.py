"""``python -m benchmarks``: every benchmark, one table, ratios from one run.

Each module's ``run()`` measures ours and its baseline (upstream vLLM, no
boundary, ruff, a bare vLLM import) in the same process run, so the ratios
compare like with like on whatever machine this is. ``--markdown`` prints the
table as Markdown for ``docs/performance.md``; ``--only`` / ``--skip`` pick
modules (the soak takes about three minutes).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

MODULES = (
    "bench_errors",
    "bench_sanitize",
    "bench_http",
    "bench_startup",
    "bench_audit",
    "bench_ray",
    "bench_burst",
    "bench_partition",
    "soak",
)
COLUMNS = ("benchmark", "ours", "baseline", "ratio", "unit")


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def gather(modules: Sequence[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name in modules:
        module = importlib.import_module(f"benchmarks.{name}")
        for row in module.run():
            rows.append({"module": name, **row})
    return rows


def render(rows: list[dict[str, object]], *, markdown: bool) -> str:
    header = ("module", *COLUMNS)
    table = [[_cell(row.get(col)) for col in header] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in table]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        for cells in table
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--only", nargs="*", choices=MODULES)
    parser.add_argument("--skip", nargs="*", choices=MODULES, default=[])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    modules = [m for m in (args.only or MODULES) if m not in args.skip]
    rows = gather(modules)
    print(render(rows, markdown=args.markdown))
    failed = [row for row in rows if row.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
