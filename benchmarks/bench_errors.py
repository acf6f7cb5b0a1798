"""Benchmark the errors core against upstream vLLM's error path, same process.

Each row runs both sides on the same realistic mix of exceptions (validation
with a parameter, not found, unprocessable, generic client, generation error,
engine dead, raw ``ValueError`` / ``KeyError``, messages carrying paths,
frames and addresses), warms up, then takes the best of N ``timeit`` repeats,
interleaving the two sides so that machine noise hits both alike.

Rows:

- ``normalize+render http``: ``normalize`` + ``render.http_error_response``
  (ours, with a request id, so the response also gets the ``X-Request-Id``
  header and the error counter is incremented) vs upstream's
  ``create_error_response`` + ``JSONResponse(err.model_dump(),
  status_code=err.error.code)``, as its exception handler does; target:
  ratio <= 1.0. The ``unique messages`` row is the same with every
  message different (no repeated text for the sanitizer to remember);
- ``normalize``: the classification alone vs ``create_error_response`` alone;
- ``wire round trip``: ``OmniErrorDetails.from_wire(d.to_wire())`` vs
  upstream's ``ErrorResponse.model_validate(err.model_dump())``;
- ``msgpack size``: ``len(msgspec.msgpack.encode(d.to_wire()))`` vs the same
  for upstream's ``err.model_dump()``, mean bytes per record (ours carries
  the legacy flat fields too, so a 0.30 receiver can read it);
- ``stage record, compact`` / ``stage record, full``: the stage wire's
  ``error`` message between two 0.31 peers (after ``welcome``) and before
  (both texts, for a possibly-0.30 orchestrator) vs the 0.30 record
  (``legacy_wire``), mean bytes per record, and the compact record vs
  upstream's ``ErrorResponse`` (the ``msgpack size`` baseline, which carries
  no request or stage id); target for compact: ratio <= 1.3 against both.

``python benchmarks/bench_errors.py`` prints a table; ``run()`` returns the
rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from collections.abc import Callable

import msgspec
from starlette.responses import JSONResponse
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import (
    create_error_response,
)

from vllm_omni.errors import (
    EngineDeadError,
    GenerationError,
    OmniErrorDetails,
    VLLMClientError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
    normalize,
)
from vllm_omni.errors.render import http_error_response
from vllm_omni.wire.messages import ErrorMessage
from vllm_omni.wire.messages import encode as encode_message

REQUEST_ID = "chatcmpl-0123456789abcdef"

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.11/site-packages/vllm_omni/stages/audio.py", '
    "line 212, in decode\n"
    "    frames = self._codec.decode(tokens)\n"
    '  File "/usr/lib/python3.11/site-packages/codec/core.py", line 88, in decode\n'
    '    raise RuntimeError("bad frame")\n'
    "RuntimeError: bad frame in /home/runner/cache/codec-v2/weights.bin"
)


def exception_mix(tag: str = "") -> list[BaseException]:
    """The errors a busy server renders; ``tag`` makes every message unique."""
    return [
        VLLMValidationError(
            f"temperature must be in [0, 2], got 3.5{tag}.",
            parameter="temperature",
            value=3.5,
        ),
        VLLMValidationError(
            f"max_tokens must be at least 1, got 0{tag}.",
            parameter="max_tokens",
            value=0,
        ),
        VLLMNotFoundError(f"The model `omni-large{tag}` does not exist."),
        VLLMUnprocessableEntityError(
            f"Failed to load the image from the given URL{tag}: 404 Not Found",
            parameter="messages.0.content",
        ),
        VLLMClientError(
            "This model's maximum context length is 4096 tokens. However, you "
            f"requested 5000{tag} tokens (1000 in the messages, 4000 in the "
            "completion)."
        ),
        VLLMClientError(
            f"Could not read /home/runner/uploads/input{tag}.wav: "
            "<_io.BufferedReader object at 0x7f3a2b1c4d50>"
        ),
        GenerationError(f"KV cache load failed for this request{tag}."),
        EngineDeadError(),
        VLLMServerError(
            'CUDA error: device-side assert triggered at File "/opt/torch/cuda.py", '
            f"line 300, in synchronize{tag}"
        ),
        ValueError(f"invalid literal for int() with base 10: 'abc{tag}'"),
        KeyError(f"audio{tag}"),
        RuntimeError(TRACEBACK + tag),
    ]


def _best_us(
    sides: dict[str, Callable[[], object]], per_call: int, repeat: int, number: int
) -> dict[str, float]:
    """Best-of-``repeat`` µs per item for each side, interleaved."""
    timers = {name: timeit.Timer(fn) for name, fn in sides.items()}
    for timer in timers.values():
        timer.timeit(number=max(1, number // 10))  # warm-up
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeat):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(number=number))
    return {name: t / (number * per_call) * 1e6 for name, t in best.items()}


def _row(name: str, ours: float, baseline: float, unit: str) -> dict[str, object]:
    return {
        "benchmark": name,
        "ours": round(ours, 2),
        "baseline": round(baseline, 2),
        "ratio": round(ours / baseline, 3),
        "unit": unit,
    }


def run(
    repeat: int = 7, number: int = 300, *, quick: bool = False
) -> list[dict[str, object]]:
    """Rows for ours vs upstream; best of ``repeat`` runs of ``number`` loops
    (``quick``: one run of five)."""
    if quick:
        repeat, number = 1, 5
    excs = exception_mix()
    count = len(excs)
    # Every message different, more of them than the sanitizer remembers: the
    # cost when no message repeats.
    unique = [exc for i in range(number) for exc in exception_mix(f" #{i}")]

    def ours_http(excs: list[BaseException] = excs) -> None:
        for exc in excs:
            http_error_response(normalize(exc, request_id=REQUEST_ID))

    def upstream_http(excs: list[BaseException] = excs) -> None:
        for exc in excs:
            err = create_error_response(exc)  # type: ignore[arg-type]
            JSONResponse(err.model_dump(), status_code=err.error.code)

    def ours_normalize() -> None:
        for exc in excs:
            normalize(exc, request_id=REQUEST_ID)

    def upstream_normalize() -> None:
        for exc in excs:
            create_error_response(exc)  # type: ignore[arg-type]

    records = [normalize(exc, request_id=REQUEST_ID) for exc in excs]
    responses = [create_error_response(exc) for exc in excs]  # type: ignore[arg-type]

    def ours_wire() -> None:
        for record in records:
            OmniErrorDetails.from_wire(record.to_wire())

    def upstream_wire() -> None:
        for response in responses:
            ErrorResponse.model_validate(response.model_dump())

    http = _best_us({"ours": ours_http, "up": upstream_http}, count, repeat, number)
    cold = _best_us(
        {"ours": lambda: ours_http(unique), "up": lambda: upstream_http(unique)},
        len(unique),
        repeat,
        1,
    )
    norm = _best_us(
        {"ours": ours_normalize, "up": upstream_normalize}, count, repeat, number
    )
    wire = _best_us({"ours": ours_wire, "up": upstream_wire}, count, repeat, number)
    encode = msgspec.msgpack.encode
    ours_bytes = statistics.mean(len(encode(r.to_wire())) for r in records)
    up_bytes = statistics.mean(len(encode(r.model_dump())) for r in responses)
    stage = [ErrorMessage.from_details(r) for r in records]
    legacy_bytes = statistics.mean(
        len(encode_message(e, legacy_wire=True)) for e in stage
    )
    compact_bytes = statistics.mean(len(encode_message(e, compact=True)) for e in stage)
    full_bytes = statistics.mean(len(encode_message(e)) for e in stage)
    return [
        _row("normalize+render http", http["ours"], http["up"], "us/error"),
        _row(
            "normalize+render http, unique messages",
            cold["ours"],
            cold["up"],
            "us/error",
        ),
        _row("normalize", norm["ours"], norm["up"], "us/error"),
        _row("wire round trip", wire["ours"], wire["up"], "us/record"),
        _row("msgpack size", ours_bytes, up_bytes, "bytes/record"),
        _row("stage record, compact vs 0.30", compact_bytes, legacy_bytes, "bytes"),
        _row("stage record, full vs 0.30", full_bytes, legacy_bytes, "bytes"),
        _row("stage record, compact vs upstream", compact_bytes, up_bytes, "bytes"),
    ]


def main() -> int:
    rows = run()
    print(f"{'benchmark':<40} {'ours':>9} {'upstream':>9} {'ratio':>6}  unit")
    for row in rows:
        print(
            f"{row['benchmark']:<40} {row['ours']:>9.2f} {row['baseline']:>9.2f} "
            f"{row['ratio']:>6.3f}  {row['unit']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
