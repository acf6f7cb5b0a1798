"""``bench_real_engine.paired``: how the two sides are interleaved.

Fake sides record the order they are called in; no engine runs. The blocks
alternate which side goes first, each block waits ``settle_s`` first, and
the ``i``-th request of one side's block is paired with the ``i``-th of the
other's. ``settle_seconds`` reads upstream's spin time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import bench_real_engine as bench
from tests.ports import free_port


def _side(label: str, log: list[str], clock: list[float]) -> bench.Measure:
    async def measure(request_id: str) -> float:
        log.append(request_id)
        clock[0] += 1.0
        return clock[0] if label == "ours" else -clock[0]

    return measure


def test_blocks_alternate_and_pair_by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    clock = [0.0]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(bench.asyncio, "sleep", sleep)
    pairs = asyncio.run(
        bench.paired(
            "t",
            _side("ours", log, clock),
            _side("up", log, clock),
            rounds=5,
            warmup=1,
            block=2,
            settle_s=1.5,
        )
    )
    assert log == [
        "t-warm-ours-0",
        "t-warm-up-0",
        "t-ours-0",
        "t-ours-1",
        "t-up-0",
        "t-up-1",
        "t-up-2",
        "t-up-3",
        "t-ours-2",
        "t-ours-3",
        "t-ours-4",
        "t-up-4",
    ]
    # One settle before each side's block: 3 blocks, 2 sides.
    assert sleeps == [1.5] * 6
    assert pairs == [(3.0, -5.0), (4.0, -6.0), (9.0, -7.0), (10.0, -8.0), (11.0, -12.0)]


def test_request_by_request_without_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    clock = [0.0]

    async def sleep(seconds: float) -> None:
        raise AssertionError("no settle was asked for")

    monkeypatch.setattr(bench.asyncio, "sleep", sleep)
    pairs = asyncio.run(
        bench.paired("r", _side("ours", log, clock), _side("up", log, clock), 3, 0)
    )
    assert log == ["r-ours-0", "r-up-0", "r-up-1", "r-ours-1", "r-ours-2", "r-up-2"]
    assert pairs == [(1.0, -2.0), (4.0, -3.0), (5.0, -6.0)]


def test_settle_time_is_upstream_spin_time_plus_a_margin() -> None:
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    spin = inspect.signature(SpinCondition).parameters["busy_loop_s"].default
    assert bench.settle_seconds() == pytest.approx(spin + 0.2)
    assert bench.FULL.settle and not bench.QUICK.settle


def test_repetitions_pool_their_pairs_and_show_how_far_apart_they_are() -> None:
    """Each repetition (fresh engines) keeps its own ratio beside the row
    made of every repetition's pairs."""

    def row(name: str, pairs: bench.Pairs) -> dict[str, object]:
        return bench.ratio_row(name, pairs, "<= 1.05", "ms", 1e3)

    first = [bench.Measured("ttft", [(1.0, 1.0), (1.1, 1.0), (1.2, 1.0)], row)]
    second = [bench.Measured("ttft", [(1.3, 1.0), (1.4, 1.0), (1.5, 1.0)], row)]
    (pooled,) = bench.pooled_rows([first, second])
    assert pooled["ratio"] == pytest.approx(1.25)
    assert pooled["repeats"] == "1.1, 1.4"
    assert pooled["between"] == "27.3 % apart"
    assert pooled["met"] is False
    (single,) = bench.pooled_rows([first])
    assert single["repeats"] == "1.1" and "between" not in single
    assert bench.FULL.repeat >= 2 and bench.QUICK.repeat == 1
    assert bench.FULL.pin and bench.QUICK.pin


def test_a_repetition_of_several_starts_shares_its_rounds_and_pools_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``starts`` > 1 each repetition starts the servers that many
    times, gives each start its share of the rounds, alternates which side
    starts first from start to start, and pools the starts' pairs into the
    repetition's own ratio."""

    def row(name: str, pairs: bench.Pairs) -> dict[str, object]:
        return bench.ratio_row(name, pairs, "<= 1.05", "ms", 1e3)

    calls: list[tuple[str, int, bool]] = []

    def servers(
        directory: Any, engine_args: Any, rounds: bench.Rounds, upstream_first: bool
    ) -> list[bench.Measured]:
        calls.append((directory.name, rounds.http, upstream_first))
        # Each start a little slower than the one before: its own luck.
        ratio = 1.0 + 0.1 * len(calls)
        return [bench.Measured("ttft", [(ratio, 1.0)] * rounds.http, row)]

    monkeypatch.setattr(bench, "_measure_servers", servers)
    monkeypatch.setattr(
        bench, "FULL", bench.dataclasses.replace(bench.FULL, repeat=2, http=5)
    )
    (pooled,) = bench.run(engines=False)
    assert calls == [
        ("servers-0-0", 3, False),
        ("servers-0-1", 3, True),
        ("servers-1-0", 3, False),
        ("servers-1-1", 3, True),
    ]
    # Each repetition's ratio is the median of its two starts' six pairs.
    assert pooled["repeats"] == "1.15, 1.35"
    assert bench.FULL.starts >= 2 and bench.QUICK.starts == 1
    assert bench.per_start(bench.QUICK) == bench.QUICK


def _sse_app(status: int) -> Any:
    """An ASGI app streaming a completion's events: two with text, one
    without, then ``[DONE]`` (or ``status`` and a JSON error)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if status != 200:
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": b'{"error": {}}'})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for text in ("Hel", "", "lo"):
            event = json.dumps({"choices": [{"index": 0, "text": text}]})
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {event}\n\n".encode(),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_stream_client_reads_text_events_on_one_connection() -> None:
    """``Streamer`` (the HTTP rows' client) times each event with text, reads
    the stream to its end and sends the next request on the same
    connection."""
    with _serving(_sse_app(200)) as url:
        client = bench.Streamer(url)

        async def twice() -> list[tuple[float, list[float]]]:
            first = await client.text_events({"stream": True})
            connection = client.streams
            second = await client.text_events({"stream": True})
            assert client.streams is connection
            client.close()
            return [first, second]

        for start, arrivals in asyncio.run(twice()):
            assert len(arrivals) == 2
            assert start <= arrivals[0] <= arrivals[1]


def test_the_stream_client_refuses_an_error_status() -> None:
    with _serving(_sse_app(400)) as url:
        client = bench.Streamer(url)
        with pytest.raises(RuntimeError, match="400"):
            asyncio.run(client.text_events({"stream": True}))
