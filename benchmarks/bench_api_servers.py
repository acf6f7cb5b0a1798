"""Two API server processes against one (issue 46), same run, same machine.

Two ``vllm-omni serve --pipeline reference`` servers run at once, one with
``--api-server-count 2`` and one without (access log off, as a load test
runs ``vllm serve``). Apache Bench (``ab``, C: the client must not be the
bottleneck on two cores) drives each with ``CONCURRENCY`` keep-alive
connections; a round runs one block on each server, the first one
alternating, and gives one ratio (N=2 requests/s over N=1's). Rows are the
median of the rounds with their interquartile range (``benchmarks.paired``):

- ``front end only``: ``GET /v1/models``, answered in the API server
  process (no engine);
- ``error route``: a chat request for a model the server does not serve,
  a 404 decided in the API server process before the engine;
- ``success route``: a two-token chat completion through the guardrail and
  the text stage: each request crosses from the API server process to the
  engine process and back at N=2;

each with the target ≥ 1.6 from issue 46. Correctness rows (CI fails on
them): every request got the route's status (``ab`` counts the others),
and ``http_requests_total`` read from the N=2 server's ``/metrics`` (any
process: the sum over both) grew by exactly the requests sent.

``python -m benchmarks.bench_api_servers [--quick]``; ``run()`` returns the
rows for ``python -m benchmarks``. Needs ``ab`` (Debian: apache2-utils).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.paired import failed, met, spread, table, target_table
from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import metric_samples

CONCURRENCY = 32
REQUESTS = {"front end only": 20000, "error route": 8000, "success route": 3000}
QUICK_REQUESTS = 300
ROUNDS = 5
QUICK_ROUNDS = 1
TARGET = ">= 1.6"
COUNTS = (1, 2)
_CHAT = "/v1/chat/completions"
# route name → (path, JSON body or None for a GET, the status every answer has)
ROUTES: dict[str, tuple[str, dict[str, object] | None, int]] = {
    "front end only": ("/v1/models", None, 200),
    "error route": (
        _CHAT,
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        404,
    ),
    "success route": (
        _CHAT,
        {
            "model": "omni-reference",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
        200,
    ),
}
_RPS = re.compile(r"Requests per second:\s+([\d.]+)")
_FAILED = re.compile(r"Failed requests:\s+(\d+)")
_NON_2XX = re.compile(r"Non-2xx responses:\s+(\d+)")
_COMPLETE = re.compile(r"Complete requests:\s+(\d+)")


def _ab() -> str:
    found = shutil.which("ab")
    if found is None:
        raise RuntimeError(
            "bench_api_servers needs ab (Debian: apt install apache2-utils)"
        )
    return found


def _block(
    ab: str, server: OmniServer, route: str, count: int, directory: Path
) -> tuple[float, int, int]:
    """One block of ``count`` requests: (requests/s, answered, wrong status)."""
    path, body, status = ROUTES[route]
    argv = [ab, "-k", "-q", "-c", str(CONCURRENCY), "-n", str(count)]
    if body is not None:
        payload = directory / f"{route.replace(' ', '-')}.json"
        payload.write_text(json.dumps(body))
        argv += ["-p", str(payload), "-T", "application/json"]
    done = subprocess.run(
        [*argv, server.base_url + path], capture_output=True, text=True, timeout=600
    )
    out = done.stdout
    if done.returncode != 0 or not _RPS.search(out):
        raise RuntimeError(f"ab failed ({done.returncode}): {out[-500:]}{done.stderr}")
    completed = int(_COMPLETE.search(out).group(1))  # type: ignore[union-attr]
    failures = int(_FAILED.search(out).group(1))  # type: ignore[union-attr]
    non_2xx = int(m.group(1)) if (m := _NON_2XX.search(out)) else 0
    wrong = failures + (non_2xx if status < 300 else completed - non_2xx)
    return float(_RPS.search(out).group(1)), completed, wrong  # type: ignore[union-attr]


def _requests_total(server: OmniServer) -> float:
    return sum(
        value
        for (name, _), value in metric_samples(server.base_url).items()
        if name == "http_requests_total"
    )


def _start(directory: Path, count: int) -> OmniServer:
    where = directory / f"n{count}"
    return start_server(
        where,
        "reference",
        job_store=where / "jobs.sqlite3",
        extra_args=(
            "--api-server-count",
            str(count),
            "--max-num-queued-reqs",
            "4096",
            "--disable-uvicorn-access-log",
            "--log-level",
            "warning",
        ),
    )


def run(quick: bool = False) -> list[dict[str, object]]:
    ab = _ab()
    rounds = QUICK_ROUNDS if quick else ROUNDS
    directory = Path(tempfile.mkdtemp(prefix="vllm-omni-bench-asc-"))
    servers = {count: _start(directory, count) for count in COUNTS}
    rows: list[dict[str, object]] = []
    try:
        for server in servers.values():
            server.wait_ready(180)
        metered_before = _requests_total(servers[2])
        sent_to_two = 0
        wrong = 0
        for route in ROUTES:
            count = QUICK_REQUESTS if quick else REQUESTS[route]
            for server in servers.values():  # warm-up, not timed
                _block(ab, server, route, max(100, count // 10), directory)
                if server is servers[2]:
                    sent_to_two += max(100, count // 10)
            rates: dict[int, list[float]] = {c: [] for c in COUNTS}
            for index in range(rounds):
                order = COUNTS if index % 2 == 0 else COUNTS[::-1]
                for n in order:
                    rps, answered, bad = _block(ab, servers[n], route, count, directory)
                    rates[n].append(rps)
                    wrong += bad
                    if n == 2:
                        sent_to_two += answered
            ratios = [two / one for one, two in zip(rates[1], rates[2], strict=True)]
            ratio = spread(ratios)
            rows.append(
                {
                    "benchmark": f"api servers: {route}, N=2 vs N=1",
                    "ours": round(statistics.median(rates[2])),
                    "baseline": round(statistics.median(rates[1])),
                    "ratio": ratio.median,
                    "spread": str(ratio),
                    "unit": "req/s",
                    "target": TARGET,
                    "met": met(ratio.median, TARGET),
                }
            )
        metered = _requests_total(servers[2]) - metered_before
        rows.append(
            {
                "benchmark": "api servers: answers with another status than the "
                "route's",
                "ours": wrong,
                "baseline": 0,
                "unit": "requests",
                "ok": wrong == 0,
            }
        )
        rows.append(
            {
                "benchmark": "api servers: http_requests_total growth at N=2 (sum of "
                "both processes) vs requests sent",
                "ours": metered,
                "baseline": sent_to_two,
                "unit": "requests",
                "ok": metered == sent_to_two,
            }
        )
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = run(quick=args.quick)
    header = ("benchmark", "ours", "baseline", "ratio", "spread", "unit", "ok")
    body = [[str(row.get(col, "–")) for col in header] for row in rows]
    print(table(header, body))
    print()
    print(target_table(rows))
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
