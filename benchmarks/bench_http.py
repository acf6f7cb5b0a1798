"""HTTP boundary cost, ours against no boundary and against upstream, same run.

Rows (requests/s through a real FastAPI app driven in-process by httpx's
ASGI transport, the Prometheus instrumentator mounted on each app as vLLM
mounts it, each on its own registry so every app really counts):

- ``success route``: a 200 route with ``install_error_handling`` as
  ``vllm-omni serve`` installs it (request ids, the disconnect watch, the
  body and WebSocket message limits at their defaults) vs the same app
  without it; target: ratio >= 0.98;
- ``error route``: a mix of semantic and raw errors through ours vs through
  upstream's ``init_exception_handler``; target: ratio >= 1.2 (issue 38)
  although ours sanitizes more, counts every error and logs;
- ``boundary alone``: the boundary's own CPU time per success around a bare
  ASGI app (no client, no framework, no instrumentator), and of that the
  request id with its ``X-Request-Id`` header: what the success route's
  ratio is made of;
- ``success route, tracing on``: the success app with the server span
  middleware and OTLP/HTTP export to a live receiver (issue 39) vs the same
  app with tracing off (which installs nothing); target: ratio >= 0.98. It
  runs in a child process (tracing, once on, stays on in a process), timed
  by the child's process CPU time so the exporter's thread counts too; the
  receiver runs in this process, and the row says how many of the spans
  arrived.

All apps are up at once. Each round times one block of ``BLOCK`` requests
on each side of a pair, the side that goes first alternating, and gives one
ratio (baseline time / our time: our throughput relative to the
baseline's); a row is the median of the rounds' ratios with their
interquartile range (``benchmarks.paired``), so load that comes and goes
on the machine falls on both sides of a round alike. The time is the CPU
time of this thread (client, app and event loop all run in it), so time the
machine hands to other processes in the middle of a block is not counted
either (it still varies with what shares the core's caches). Requests/s
are the reciprocal of that CPU time per request.

``--breakdown`` adds the success route's layers one at a time, all up in
the same run and timed in the same rotating rounds against the app without
a boundary: the handlers ``install_error_handling`` registers, one
pass-through middleware where the boundary goes, then the boundary's own
steps in its order (abort context, disconnect watch, the ``send`` wrapper,
a fixed ``X-Request-Id`` header, the request id; ``_Partial`` stops after
each), then the boundary as installed (with the body limit). Each row
gives its CPU µs per
request, what it adds to the row before it (median of the rounds'
differences) and its Python and C calls per request (counted by
``cProfile``: exact, whatever the load). The app in this process is
driven through httpx's ASGI transport, so a header also costs the client
parsing it.

``python -m benchmarks.bench_http [--quick] [--breakdown]`` prints the rows
and the target table; ``run()`` returns rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from vllm.entrypoints.serve.exception_handling.register import init_exception_handler
from vllm.exceptions import VLLMNotFoundError, VLLMValidationError

from benchmarks.paired import met, spread, table, target_table
from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.errors import OmniConflictError, OmniServiceUnavailableError
from vllm_omni.errors.http import ErrorBoundary, install_error_handling
from vllm_omni.errors.http.disconnects import DisconnectWatch, Watchlist
from vllm_omni.errors.http.request_ids import with_request_id
from vllm_omni.errors.metrics import AbortContext, set_abort_context

BLOCK = 10
ROUNDS = 400
QUICK_ROUNDS = 8
BREAKDOWN_ROUNDS = 300
PROFILED_REQUESTS = 200
SUCCESS_TARGET = ">= 0.98"
TRACING_TARGET = ">= 0.98"
ERROR_TARGET = ">= 1.2"

ERRORS: tuple[Callable[[], Exception], ...] = (
    lambda: VLLMValidationError("temperature must be <= 2", parameter="temperature"),
    lambda: VLLMNotFoundError("The model `x` does not exist."),
    lambda: OmniConflictError("job is still running"),
    lambda: OmniServiceUnavailableError("pipeline has no audio stage"),
    lambda: KeyError("missing"),
)


def _app(boundary: str, steps: int | None = None) -> FastAPI:
    """The bench app: ``boundary`` is ``ours`` (as ``vllm-omni serve``
    installs it), ``upstream`` (vLLM's handlers), ``none``, or ``handlers``
    (ours without the boundary middleware; with ``steps``, ``_Partial``
    in its place)."""
    app = FastAPI()
    app.state.args = argparse.Namespace(log_error_stack=False)
    counter = {"i": 0}

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/fail")
    async def fail() -> dict[str, str]:
        counter["i"] += 1
        raise ERRORS[counter["i"] % len(ERRORS)]()

    if boundary in ("ours", "handlers"):
        limits = RequestLimits()
        install_error_handling(
            app,
            max_request_bytes=limits.max_request_bytes,
            max_ws_message_bytes=limits.max_ws_message_bytes,
        )
    if boundary == "handlers":
        app.user_middleware[:] = [
            m for m in app.user_middleware if m.cls is not ErrorBoundary
        ]
        if steps is not None:
            app.user_middleware.append(Middleware(_Partial, steps=steps))
    elif boundary == "upstream":
        init_exception_handler(app)
    Instrumentator(registry=CollectorRegistry()).instrument(app)
    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://bench",
    )


async def _block(
    client: httpx.AsyncClient,
    path: str,
    clock: Callable[[], float] = time.thread_time,
) -> float:
    # CPU time of this thread, which runs client, app and loop: time the
    # machine gives other processes mid-block does not count.
    started = clock()
    for _ in range(BLOCK):
        await client.get(path)
    return clock() - started


async def compare(
    path: str,
    ours: FastAPI,
    baseline: FastAPI,
    rounds: int,
    clock: Callable[[], float] = time.thread_time,
) -> dict[str, object]:
    """Paired rounds on ``path``: our throughput relative to the baseline's."""
    sides = [_client(ours), _client(baseline)]
    ratios: list[float] = []
    rates: tuple[list[float], list[float]] = ([], [])
    try:
        for client in sides:
            for _ in range(3):
                await _block(client, path, clock)  # warm-up, not counted
        for index in range(rounds):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            seconds = [0.0, 0.0]
            for side in order:
                seconds[side] = await _block(sides[side], path, clock)
            ratios.append(seconds[1] / seconds[0])
            rates[0].append(BLOCK / seconds[0])
            rates[1].append(BLOCK / seconds[1])
    finally:
        for client in sides:
            await client.aclose()
    summary = spread(ratios)
    return {
        "ours": round(statistics.median(rates[0]), 1),
        "baseline": round(statistics.median(rates[1]), 1),
        "ratio": round(summary.median, 3),
        "spread": str(summary),
        "unit": "req/s",
    }


async def _bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


async def _cpu_us(app: ASGIApp, number: int) -> float:
    """CPU µs per request of ``app`` driven directly (no client, no framework):
    the least of five runs of ``number``."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    best = float("inf")
    for _ in range(5):
        started = time.thread_time()
        for _ in range(number):
            await app({"type": "http", "headers": [], "method": "GET"}, receive, send)
        best = min(best, time.thread_time() - started)
    return best / number * 1e6


async def boundary_cost(number: int) -> dict[str, float]:
    """What the boundary itself costs a success, in CPU µs per request."""
    limits = RequestLimits()
    boundary = ErrorBoundary(
        _bare_app,
        max_request_bytes=limits.max_request_bytes,
        max_ws_message_bytes=limits.max_ws_message_bytes,
    )
    bare = await _cpu_us(_bare_app, number)
    return {
        "bare": bare,
        "boundary": await _cpu_us(boundary, number) - bare,
        # The request id and its response header: the boundary's steps with
        # it against the same steps without it.
        "request id": await _cpu_us(_Partial(_bare_app, REQUEST_ID), number)
        - await _cpu_us(_Partial(_bare_app, SEND), number),
    }


def _traced_compare(rounds: int) -> dict[str, object]:
    """In the child process: tracing on (the environment's endpoint), the
    success app with the server span vs without, by process CPU time."""
    from vllm_omni.tracing.asgi import install_tracing
    from vllm_omni.tracing.provider import configure, flush

    assert configure(None, process="bench")
    traced = _app("ours")
    install_tracing(traced)
    row = asyncio.run(
        compare("/ok", traced, _app("ours"), rounds, clock=time.process_time)
    )
    flush(30)
    return {**row, "traced": BLOCK * (rounds + 3)}


def tracing_row(rounds: int) -> dict[str, object]:
    """The success route with tracing on vs off, measured in a child process
    exporting to a receiver in this one."""
    from tests.otlp_receiver import Receiver

    receiver = Receiver()
    receiver.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_http", "--traced", str(rounds)],
            env={
                **os.environ,
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            },
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 10
        while len(receiver.spans) < row["traced"] and time.monotonic() < deadline:
            time.sleep(0.05)
        received = len(receiver.spans)
    finally:
        receiver.stop()
    traced = row.pop("traced")
    return {
        "benchmark": "success route, tracing on vs off (live receiver)",
        **row,
        "unit": f"req/s ({received} of {traced} spans received)",
        "target": TRACING_TARGET,
        "met": met(float(row["ratio"]), TRACING_TARGET),
    }


# The boundary's steps on a success, in its order (``_Partial``).
PASS_THROUGH, ABORT_CONTEXT, WATCH, SEND, HEADER, REQUEST_ID = range(6)
# The header alone, with a fixed value: what one more response header costs
# the instrumentator and the client (httpx parses it, its cookie jar too).
_FIXED_ID = (b"x-request-id", b"0" * 32)
LAYERS: tuple[tuple[str, str, int | None], ...] = (
    ("no boundary", "none", None),
    ("+ install_error_handling's handlers", "handlers", None),
    ("+ a pass-through middleware in its place", "handlers", PASS_THROUGH),
    ("+ abort context (per request)", "handlers", ABORT_CONTEXT),
    ("+ disconnect watch (receive wrapper)", "handlers", WATCH),
    ("+ send wrapper (start and end noted)", "handlers", SEND),
    ("+ an X-Request-Id header (fixed value)", "handlers", HEADER),
    ("+ the request id itself (chosen per request)", "handlers", REQUEST_ID),
    ("= ErrorBoundary as installed (+ body limit)", "ours", None),
)


class _Partial:
    """``ErrorBoundary``'s success path up to ``steps`` (its steps in its
    order), for the breakdown only: the last breakdown row, the boundary
    itself, shows when this and the boundary drift apart."""

    def __init__(self, app: ASGIApp, steps: int) -> None:
        self.app = app
        self.steps = steps
        self._watchlist: Watchlist | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.steps == PASS_THROUGH:
            await self.app(scope, receive, send)
            return
        context = AbortContext()
        set_abort_context(context)
        if self.steps == ABORT_CONTEXT:
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        if self._watchlist is None or self._watchlist.loop is not task.get_loop():
            self._watchlist = Watchlist(task.get_loop())
        watch = DisconnectWatch(receive, context, task, self._watchlist)
        steps = self.steps

        async def send_tracked(message: Message) -> None:
            if not watch.started and message["type"] == "http.response.start":
                watch.started = True
                if steps == REQUEST_ID:
                    message = with_request_id(message, scope)
                elif steps == HEADER:
                    message = {**message, "headers": [*message["headers"], _FIXED_ID]}
            elif message["type"] == "http.response.body" and not message.get(
                "more_body", False
            ):
                watch.completed = True
            await send(message)

        try:
            await self.app(
                scope, watch.receive, send if self.steps == WATCH else send_tracked
            )
        finally:
            watch.forget()
            if watch.watching:
                await watch.stop()


async def _calls_per_request(client: httpx.AsyncClient, number: int) -> float:
    """Python and C calls per request, counted by ``cProfile``."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(number):
        await client.get("/ok")
    profile.disable()
    return pstats.Stats(profile).total_calls / number  # type: ignore[attr-defined,no-any-return]


async def breakdown(rounds: int, profiled: int) -> list[dict[str, object]]:
    """The success route's layers added one at a time (``LAYERS``), all
    timed in the same rounds; each round starts with a different layer."""
    clients = [_client(_app(kind, steps)) for _, kind, steps in LAYERS]
    per_request: list[list[float]] = [[] for _ in LAYERS]
    try:
        for client in clients:
            for _ in range(3):
                await _block(client, "/ok")  # warm-up, not counted
        for index in range(rounds):
            order = list(range(len(clients)))
            shift = index % len(order)
            order = order[shift:] + order[:shift]
            if index % 2:
                order.reverse()
            for side in order:
                seconds = await _block(clients[side], "/ok")
                per_request[side].append(seconds / BLOCK * 1e6)
        calls = [await _calls_per_request(c, profiled) for c in clients]
    finally:
        for client in clients:
            await client.aclose()
    base = per_request[0]
    rows: list[dict[str, object]] = []
    for layer, (name, _, _) in enumerate(LAYERS):
        times = per_request[layer]
        before = per_request[max(layer - 1, 0)]
        added = spread(t - b for t, b in zip(times, before, strict=True))
        total = statistics.median(t - b for t, b in zip(times, base, strict=True))
        ratio = statistics.median(b / t for t, b in zip(times, base, strict=True))
        rows.append(
            {
                "benchmark": f"breakdown: {name}",
                "ours": round(statistics.median(times), 1),
                "added": round(added.median, 2),
                "spread": str(added),
                "total": round(total, 2),
                "ratio": round(ratio, 3),
                "calls": round(calls[layer] - calls[0], 1),
                "unit": "CPU us/request",
            }
        )
    return rows


def run(quick: bool = False, layers: bool = False) -> list[dict[str, object]]:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    # Error logs would dominate the measurement; both sides run quiet.
    logging.getLogger("vllm_omni.errors").setLevel(logging.CRITICAL)
    logging.getLogger("vllm").setLevel(logging.CRITICAL)
    success = asyncio.run(compare("/ok", _app("ours"), _app("none"), rounds))
    errors = asyncio.run(compare("/fail", _app("ours"), _app("upstream"), rounds))
    cost = asyncio.run(boundary_cost(200 if quick else 20000))
    rows: list[dict[str, object]] = [
        {
            "benchmark": "boundary alone, per success (bare ASGI app, no client)",
            "ours": round(cost["boundary"], 2),
            "baseline": round(cost["bare"], 2),
            "ratio": None,
            "unit": "CPU us added (baseline: the app)",
        },
        {
            "benchmark": "of which: request id and its X-Request-Id header",
            "ours": round(cost["request id"], 2),
            "baseline": None,
            "ratio": None,
            "unit": "CPU us added",
        },
    ]
    for name, row, target in (
        ("success route (with vs without boundary)", success, SUCCESS_TARGET),
        ("error route (ours vs upstream handlers)", errors, ERROR_TARGET),
    ):
        rows.append(
            {
                "benchmark": name,
                **row,
                "target": target,
                "met": met(float(row["ratio"]), target),  # type: ignore[arg-type]
            }
        )
    rows.append(tracing_row(rounds))
    if layers:
        rows += asyncio.run(
            breakdown(
                QUICK_ROUNDS if quick else BREAKDOWN_ROUNDS,
                10 if quick else PROFILED_REQUESTS,
            )
        )
    return rows


def _print_breakdown(rows: Sequence[dict[str, object]]) -> None:
    header = ("layer", "us/req", "added", "added IQR", "total", "ratio", "calls")
    body = [
        (
            str(row["benchmark"]).removeprefix("breakdown: "),
            *(
                str(row[key])
                for key in ("ours", "added", "spread", "total", "ratio", "calls")
            ),
        )
        for row in rows
        if str(row["benchmark"]).startswith("breakdown: ")
    ]
    print(table(header, body))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_http")
    parser.add_argument("--quick", action="store_true", help="a few rounds only")
    parser.add_argument("--traced", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="the success route's layers added one at a time, in the same run",
    )
    args = parser.parse_args(argv)
    if args.traced is not None:
        # The child of ``tracing_row``: one JSON row on stdout.
        logging.getLogger("vllm_omni").setLevel(logging.CRITICAL)
        print(json.dumps(_traced_compare(args.traced)))
        return 0
    rows = run(quick=args.quick, layers=args.breakdown)
    print(f"{'benchmark':56} {'ours':>9} {'baseline':>9} {'ratio':>6}  unit")
    for row in rows:
        if str(row["benchmark"]).startswith("breakdown: "):
            continue
        print(
            f"{row['benchmark']:56} {row['ours']!s:>9} {row['baseline']!s:>9} "
            f"{row['ratio']!s:>6}  {row['unit']}"
        )
    print()
    print(target_table(rows))
    if args.breakdown:
        print()
        _print_breakdown(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
