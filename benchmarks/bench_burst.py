"""Benchmark a burst behind a heavy head: nothing lost, refusals at once.

The operator's case from issue 11: an image-only pipeline, two heavy requests
(n=10, 1024x1024) at the head, then 3,000 small ones (64x64, 2 kB prompts)
all at once, with the default admission limit (1,024 in flight). Before the
fix a third of them vanished on the stage wire (504 after ``timeout_s``, or
forever without one). Now each request ends in exactly one outcome: a result,
or upstream's ``QueueOverflowError`` (503) at admission.

Rows (one engine per case, in this process):

- ``burst throughput``: completed requests/s with the heavy head vs the same
  burst without it (the baseline, same run); the ratio is the head's cost;
- ``burst rejections``: requests refused at admission (503), per case;
- ``burst p99 time to 503``: from submission to the refusal, in ms;
- ``burst lost``: requests with no outcome after the hard timeout, plus any
  gap between what the stage received and what was admitted. Must be 0.

``python benchmarks/bench_burst.py`` prints a table; ``run()`` returns the
rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.paired import failed

HEAVY = {"n": 10, "size": "1024x1024"}
SMALL = {"size": "64x64"}
BURST = 3000
# --quick: a burst that still overflows a small admission limit.
QUICK_HEAVY = {"n": 2, "size": "256x256"}
QUICK_BURST = 150
QUICK_LIMIT = 64
PADDING = "x" * 2000
HARD_TIMEOUT_S = 180.0


@dataclass(slots=True)
class Case:
    name: str
    heavy_head: bool
    timeout_s: float | None
    ok: int = 0
    refused: int = 0
    failed: int = 0
    lost: int = 0
    wire_gap: int = 0
    seconds: float = 0.0
    refusal_ms: list[float] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def p99_refusal_ms(self) -> float | None:
        if len(self.refusal_ms) < 2:
            return self.refusal_ms[0] if self.refusal_ms else None
        return statistics.quantiles(self.refusal_ms, n=100)[98]


async def _one(engine: Any, index: int, params: dict[str, Any], case: Case) -> None:
    from vllm.exceptions import QueueOverflowError

    started = time.perf_counter()
    try:
        async for _ in engine.generate(
            f"burst {index} {PADDING}",
            request_id=f"burst-{index}",
            modalities="image",
            params=params,
        ):
            pass
        case.ok += 1
    except QueueOverflowError:
        case.refused += 1
        case.refusal_ms.append((time.perf_counter() - started) * 1000.0)
    except Exception:
        case.failed += 1


async def _run_case(case: Case, directory: Path, quick: bool) -> None:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    stage: dict[str, Any] = {"id": 0, "name": "image", "kind": "image"}
    if case.timeout_s is not None:
        stage["timeout_s"] = case.timeout_s
    path = directory / f"{case.name.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump({"model": "burst", "stages": [stage]}))
    limits = {"max_num_queued_reqs": QUICK_LIMIT} if quick else {}
    engine = await AsyncOmni.create(pipeline=path, **limits)
    try:
        heavy = QUICK_HEAVY if quick else HEAVY
        head = [heavy, heavy] if case.heavy_head else []
        params = head + [SMALL] * (QUICK_BURST if quick else BURST)
        began = time.perf_counter()
        tasks = [
            asyncio.create_task(_one(engine, i, p, case)) for i, p in enumerate(params)
        ]
        _, pending = await asyncio.wait(tasks, timeout=HARD_TIMEOUT_S)
        case.seconds = time.perf_counter() - began
        case.lost = len(pending)
        for task in pending:
            task.cancel()
        stats = (await engine.stage_stats())[0] or {}
        admitted = len(params) - case.refused
        case.wire_gap = abs(admitted - int(stats.get("submitted", 0)))
    finally:
        engine.shutdown()


def measure(quick: bool = False) -> list[Case]:
    from vllm_omni.engine.processes import start_launcher

    # The stage launcher, started before the clock runs (as serve does).
    start_launcher()
    cases = [
        Case("no heavy head (baseline)", heavy_head=False, timeout_s=20.0),
        Case("heavy head, timeout_s 20", heavy_head=True, timeout_s=20.0),
        Case("heavy head, no timeout_s", heavy_head=True, timeout_s=None),
    ]
    with tempfile.TemporaryDirectory(prefix="vllm-omni-burst-") as directory:
        for case in cases:
            asyncio.run(_run_case(case, Path(directory), quick))
    return cases


def run(quick: bool = False) -> list[dict[str, object]]:
    """The rows (``quick``: 150 small requests behind two small heavy ones,
    against an admission limit of 64)."""
    baseline, *heavy = measure(quick)
    burst = QUICK_BURST if quick else BURST
    rows: list[dict[str, object]] = []
    for case in heavy:
        rows.append(
            {
                "benchmark": f"burst throughput ({case.name})",
                "ours": round(case.throughput, 1),
                "baseline": round(baseline.throughput, 1),
                "ratio": round(case.throughput / baseline.throughput, 3)
                if baseline.throughput
                else None,
                "unit": "req/s",
            }
        )
    for case in (baseline, *heavy):
        rows.append(
            {
                "benchmark": f"burst rejections ({case.name})",
                "ours": case.refused,
                "baseline": None,
                "ratio": None,
                "unit": f"of {burst + 2 * case.heavy_head}",
            }
        )
        rows.append(
            {
                "benchmark": f"burst p99 time to 503 ({case.name})",
                "ours": None
                if case.p99_refusal_ms is None
                else round(case.p99_refusal_ms, 3),
                "baseline": None,
                "ratio": None,
                "unit": "ms",
            }
        )
        lost = case.lost + case.wire_gap + case.failed
        rows.append(
            {
                "benchmark": f"burst lost or failed ({case.name})",
                "ours": lost,
                "baseline": None,
                "ratio": None,
                "unit": "requests",
                "ok": lost == 0,
            }
        )
    return rows


def main() -> int:
    rows = run()
    for row in rows:
        print(
            f"{row['benchmark']}: {row['ours']} {row['unit']}"
            + (f" (baseline {row['baseline']})" if row.get("baseline") else "")
        )
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
