"""Where a request's time goes: hop marks turned into the per-hop table.

Reads the marks of ``vllm_omni.wire.hops`` (the caller's process and every
stage's, gathered by ``bench_real_engine --breakdown``) and follows each
request along its critical path, one step per process boundary or piece of
work, in the causal order of the route:

- before a stage that is not the last: the orchestrator submits, the stage
  receives, its task starts, it yields its payload, it sends ``finished``;
  the orchestrator submits to the next stage once it has read that;
- at the last stage: … the engine is called, its first output arrives, the
  stage yields and sends the payload, the orchestrator receives it and
  yields it, and the caller has its first token (or, for a rejected
  request: the engine raised, the stage sent its record, the orchestrator
  read it, the caller has the exception).

Only the steps a request really went through are used (a stage that runs
in the orchestrator's process has fewer), so the same code reads every
topology. Each segment is the time between two consecutive steps; the
table gives its median over the requests, in ms.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from vllm_omni.wire.hops import Mark

__all__ = [
    "by_request",
    "critical_path",
    "per_token",
    "segment_table",
    "send_cost",
]

# The steps of a stage before the last one, in causal order.
_THROUGH = (
    "orchestrator.submit",
    "stage.received",
    "stage.started",
    "stage.payload",
    "stage.finished",
)
# The steps of the last stage up to the caller's first token.
_LAST = (
    "orchestrator.submit",
    "stage.received",
    "stage.started",
    "engine.generate",
    "engine.output",
    "stage.payload",
    "orchestrator.received",
    "orchestrator.yield",
)
# The steps of the last stage up to the caller's exception.
_LAST_FAILING = (
    "orchestrator.submit",
    "stage.received",
    "stage.started",
    "engine.generate",
    "stage.failing",
    "stage.failed",
    "orchestrator.error",
)


def by_request(marks: Iterable[Mark]) -> dict[str, list[Mark]]:
    """The marks of each request, oldest first."""
    grouped: dict[str, list[Mark]] = defaultdict(list)
    for entry in marks:
        grouped[entry[0]].append(entry)
    for entries in grouped.values():
        entries.sort(key=lambda entry: entry[3])
    return dict(grouped)


def _first(marks: Sequence[Mark], point: str, stage: int, after: int) -> int | None:
    for _, name, stage_id, ns in marks:
        if name == point and stage_id == stage and ns >= after:
            return ns
    return None


def critical_path(
    marks: Sequence[Mark],
    route: Sequence[tuple[int, str]],
    *,
    start: str,
    end: str,
    failing: bool = False,
) -> list[tuple[str, int]]:
    """``(step, time)`` along ``route`` (stage ids and names), from the
    caller's ``start`` mark to its ``end`` mark; steps a request did not
    make are left out."""
    begin = _first(marks, start, -1, 0)
    if begin is None:
        return []
    path = [(start, begin)]
    now = begin
    at = _first(marks, "orchestrator.generate", -1, now)
    if at is not None:
        path.append(("orchestrator.generate", at))
        now = at
    for index, (stage_id, name) in enumerate(route):
        last = index == len(route) - 1
        steps = (_LAST_FAILING if failing else _LAST) if last else _THROUGH
        for point in steps:
            at = _first(marks, point, stage_id, now)
            if at is not None:
                path.append((f"{point} [{name}]", at))
                now = at
    at = _first(marks, end, -1, now)
    if at is None:
        return []
    path.append((end, at))
    return path


def per_token(
    marks: Sequence[Mark], stage: tuple[int, str], caller: str
) -> list[list[tuple[str, int]]]:
    """Each streamed token after the first, from the engine's output to the
    caller: engine output, stage payload, orchestrator receive, orchestrator
    yield, the caller's ``caller`` mark (``stage.sent``, after the send, is
    not on the path: the orchestrator may read before the stage marks it)."""
    stage_id, name = stage
    series: dict[str, list[int]] = defaultdict(list)
    for _, point, sid, ns in marks:
        if point == caller or sid == stage_id:
            series[point].append(ns)
    payloads = series["stage.payload"]
    paths = []
    for k in range(1, len(payloads)):
        try:
            output = max(t for t in series["engine.output"] if t <= payloads[k])
            steps = [
                (f"engine.output [{name}]", output),
                (f"stage.payload [{name}]", payloads[k]),
                (f"orchestrator.received [{name}]", series["orchestrator.received"][k]),
                (f"orchestrator.yield [{name}]", series["orchestrator.yield"][k]),
                (caller, series[caller][k]),
            ]
        except (IndexError, ValueError):
            continue
        paths.append(steps)
    return paths


def send_cost(marks: Sequence[Mark], stage_id: int) -> list[float]:
    """ms from each payload to the end of its send (encode, ZMQ send)."""
    payloads = [ns for _, p, s, ns in marks if p == "stage.payload" and s == stage_id]
    sent = [ns for _, p, s, ns in marks if p == "stage.sent" and s == stage_id]
    return [(b - a) / 1e6 for a, b in zip(payloads, sent, strict=False)]


def segment_table(
    paths: Iterable[Sequence[tuple[str, int]]],
    describe: Mapping[tuple[str, str], str],
) -> list[tuple[str, str, float]]:
    """(segment, what it is, median ms) in path order; the last row is the
    median total. ``describe`` maps (from point, to point), stage names
    stripped, to a description."""
    segments: dict[str, list[float]] = {}
    totals: list[float] = []
    for path in paths:
        if len(path) < 2:
            continue
        totals.append((path[-1][1] - path[0][1]) / 1e6)
        for (a, t0), (b, t1) in itertools.pairwise(path):
            segments.setdefault(f"{a} → {b}", []).append((t1 - t0) / 1e6)
    rows = []
    for label, values in segments.items():
        a, _, b = label.partition(" → ")
        key = (a.split(" [")[0], b.split(" [")[0])
        rows.append((label, describe.get(key, ""), statistics.median(values)))
    if totals:
        rows.append(("total", "", statistics.median(totals)))
    return rows
