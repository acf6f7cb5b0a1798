"""``python -m benchmarks``: every benchmark, one table, ratios from one run.

Each module's ``run()`` measures ours and its baseline (upstream vLLM, no
boundary, ruff, a bare vLLM import) in the same process run, so the ratios
compare like with like on whatever machine this is. ``--markdown`` prints the
tables as Markdown for ``docs/performance.md``; ``--only`` / ``--skip`` pick
modules (the soak takes about three minutes).

After the full table comes the compact one of every row with a target
(metric, ratio, spread, target, met). Targets are information: a missed one
does not change the exit code.

``--quick`` runs every module with small counts, so that CI (``.ci/run``)
notices a benchmark that no longer imports or crashes; its timings mean
nothing, its correctness rows everything. Either run exits non-zero when a
module raised or a correctness row (``ok``: nothing lost, recall, the soak's
reconciliation) failed. ``bench_real_engine`` runs in the real-engine
environment (``.ci/real-engine``), not here.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from collections.abc import Sequence

from benchmarks.paired import failed, table, target_table

MODULES = (
    "bench_errors",
    "bench_sanitize",
    "bench_http",
    "bench_api_servers",
    "bench_startup",
    "bench_audit",
    "bench_ray",
    "bench_burst",
    "bench_partition",
    "soak",
)
COLUMNS = ("benchmark", "ours", "baseline", "ratio", "spread", "unit")


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def gather(
    modules: Sequence[str], *, quick: bool = False
) -> tuple[list[dict[str, object]], list[str]]:
    """The rows of every module that ran, and the modules that raised."""
    rows: list[dict[str, object]] = []
    crashed: list[str] = []
    for name in modules:
        started = time.monotonic()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            produced = module.run(quick=quick)
        except Exception:
            traceback.print_exc()
            crashed.append(name)
            continue
        finally:
            took = time.monotonic() - started
            print(f"benchmarks.{name}: {took:.0f} s", file=sys.stderr, flush=True)
        rows.extend({"module": name, **row} for row in produced)
    return rows, crashed


def render(rows: list[dict[str, object]], *, markdown: bool) -> str:
    header = ("module", *COLUMNS)
    body = [[_cell(row.get(col)) for col in header] for row in rows]
    return table(header, body, markdown=markdown)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--only", nargs="*", choices=MODULES)
    parser.add_argument("--skip", nargs="*", choices=MODULES, default=[])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="tiny counts: does every module run?"
    )
    args = parser.parse_args(argv)
    modules = [m for m in (args.only or MODULES) if m not in args.skip]
    load = os.getloadavg()[0]
    rows, crashed = gather(modules, quick=args.quick)
    print(render(rows, markdown=args.markdown))
    print()
    print(target_table(rows, markdown=args.markdown))
    print(
        f"\nload average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    wrong = failed(rows)
    for name in wrong:
        print(f"correctness row failed: {name}", file=sys.stderr)
    if crashed:
        print(f"crashed: {', '.join(crashed)}", file=sys.stderr)
    return 1 if crashed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
