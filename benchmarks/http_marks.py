"""Timing marks inside an HTTP server: where a streamed completion's first
token spends its time, from the request's first byte to the first SSE chunk
written, the same way for upstream's ``vllm serve`` and ``vllm serve --omni``.

A launcher (``python -m benchmarks.http_marks upstream|omni ARGS…``) that
wraps known calls of the libraries both servers share, then runs the
server exactly as its command does (upstream: ``python -m
vllm.entrypoints.openai.api_server``; ours: vLLM's ``vllm`` CLI with
``--omni``, which hands over to ``vllm_omni``). Nothing of either server is
copied or changed: each mark is one ``perf_counter_ns`` appended to a list
at a call both servers make (uvicorn's parser, the ASGI app, Starlette's
route, FastAPI's endpoint call, vLLM's renderer, ``AsyncLLM``, its input
processor, its engine-core client, its output processor and collector).
Ours adds the hop marks of ``vllm_omni.wire.hops`` (``VLLM_OMNI_TRACE_HOPS``,
set here): ``AsyncOmni``, the orchestrator and the stage.

The outermost ASGI wrapper answers ``GET /_omni_marks`` with the marks
recorded since the last call (and forgets them); that path exists only in
a server started by this launcher. Without the launcher nothing here runs:
no server pays for it.

``windows`` cuts the marks into requests: each from its ``http.begin`` to
its first ``sse.first`` (requests must not overlap: the benchmark sends
them one at a time), each point at its first occurrence in the window.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["DESCRIBE", "PATH", "install", "main", "windows"]

PATH = "/_omni_marks"

# (point, ns); a list's append is atomic, so threads (the tokenizer's
# executor) may mark too.
_marks: list[tuple[str, int]] = []


def _mark(point: str) -> None:
    _marks.append((point, time.perf_counter_ns()))


def _take() -> list[tuple[str, int]]:
    taken = list(_marks)
    del _marks[: len(taken)]
    try:
        from vllm_omni.wire import hops
    except ImportError:  # upstream's server: no vllm_omni loaded
        return taken
    return taken + [(f"omni.{point}", ns) for _, point, _, ns in hops.take()]


def _before(owner: Any, name: str, point: str) -> None:
    """Mark ``point`` when ``owner.name`` is called (sync; an async generator
    function too: the call returns the generator, no layer is added)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _mark(point)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _around(owner: Any, name: str, start: str, end: str) -> None:
    """Mark ``start`` and ``end`` around a sync call."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _mark(start)
        try:
            return original(*args, **kwargs)
        finally:
            _mark(end)

    setattr(owner, name, wrapper)


def _around_async(
    owner: Any,
    name: str,
    start: str | None,
    end: str,
    when: Callable[[Any], bool] = lambda _: True,
) -> None:
    """Mark ``start`` and ``end`` around a coroutine call; ``end`` only when
    ``when(result)``."""
    original = getattr(owner, name)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if start is not None:
            _mark(start)
        result = await original(*args, **kwargs)
        if when(result):
            _mark(end)
        return result

    setattr(owner, name, wrapper)


class _Outermost:
    """The outermost ASGI app: marks entry, the response's start and its
    first body chunk; serves ``PATH``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == PATH:
            body = json.dumps(_take()).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        _mark("asgi.enter")
        first = True

        async def marked_send(message: Any) -> None:
            nonlocal first
            if message["type"] == "http.response.start":
                _mark("response.start")
            elif first and message.get("body"):
                first = False
                _mark("sse.write")
                await send(message)
                _mark("sse.first")
                return
            await send(message)

        await self.app(scope, receive, marked_send)


def install() -> None:
    """Wrap the known calls (before the server is built)."""
    import fastapi.routing
    import starlette.routing
    import uvicorn.config
    from uvicorn.protocols.http import httptools_impl

    _before(httptools_impl.HttpToolsProtocol, "on_message_begin", "http.begin")
    _before(httptools_impl.HttpToolsProtocol, "on_headers_complete", "http.headers")
    load = uvicorn.config.Config.load

    def loaded(self: Any) -> None:
        load(self)
        self.loaded_app = _Outermost(self.loaded_app)

    uvicorn.config.Config.load = loaded  # type: ignore[method-assign]
    _before(starlette.routing.Route, "handle", "route.handle")
    run_endpoint = fastapi.routing.run_endpoint_function

    async def endpoint(**kwargs: Any) -> Any:
        _mark("endpoint.enter")
        return await run_endpoint(**kwargs)

    fastapi.routing.run_endpoint_function = endpoint  # type: ignore[assignment]

    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.v1.engine import core_client, input_processor, output_processor

    # Both servers render a completion with upstream's renderer (ours in
    # its vllm stage): the prompt's tokenization.
    _around_async(OnlineRenderer, "render_completion", "render.start", "render.end")
    from vllm.v1.engine.async_llm import AsyncLLM

    _before(AsyncLLM, "generate", "engine.generate")
    _around_async(AsyncLLM, "add_request", "engine.add_request", "engine.added")
    _around(
        input_processor.InputProcessor,
        "process_inputs",
        "input.process",
        "input.processed",
    )
    _around_async(
        core_client.AsyncMPClient,
        "get_output_async",
        None,
        "core.output",
        lambda outputs: bool(getattr(outputs, "outputs", None)),
    )
    process = output_processor.OutputProcessor.process_outputs

    @functools.wraps(process)
    def process_outputs(self: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
        result = process(self, outputs, *args, **kwargs)
        if outputs:
            _mark("detokenized")
        return result

    output_processor.OutputProcessor.process_outputs = process_outputs  # type: ignore[method-assign]
    collector = output_processor.RequestOutputCollector
    _around_async(collector, "get", None, "engine.yield")
    get_nowait = collector.get_nowait

    @functools.wraps(get_nowait)
    def got_nowait(self: Any) -> Any:
        result = get_nowait(self)
        if result is not None:
            _mark("engine.yield")
        return result

    collector.get_nowait = got_nowait  # type: ignore[method-assign]


def _install_omni() -> None:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    _before(AsyncOmni, "generate", "omni.asyncomni.generate")
    from vllm_omni.entrypoints.openai import serving_text

    # Each SSE chunk is framed here (a module global its stream calls).
    _before(serving_text, "_sse", "omni.sse.chunk")


# What each segment is, by (from point, to point). A segment not named here
# is printed with its two points only.
DESCRIBE: dict[tuple[str, str], str] = {
    ("http.begin", "http.headers"): "HTTP parsing (request line, headers)",
    ("http.headers", "asgi.enter"): "uvicorn: the request's task starts",
    ("asgi.enter", "route.handle"): "middleware (error boundary, CORS …), routing",
    ("route.handle", "endpoint.enter"): "body read, JSON, request model validation",
    ("endpoint.enter", "render.start"): "serving: request checks",
    ("render.start", "render.end"): "upstream's renderer: the prompt tokenized",
    ("render.end", "engine.generate"): "serving: SamplingParams, request building",
    ("render.end", "response.start"): "serving: request building, the stream starts",
    ("endpoint.enter", "omni.asyncomni.generate"): (
        "serving: engine health, model, stage, params"
    ),
    ("omni.asyncomni.generate", "response.start"): "the SSE response starts",
    ("response.start", "omni.orchestrator.generate"): "AsyncOmni.generate",
    ("omni.asyncomni.generate", "omni.orchestrator.generate"): "AsyncOmni.generate",
    ("omni.orchestrator.generate", "omni.orchestrator.submit"): (
        "orchestrator: checks, admission, route"
    ),
    ("omni.orchestrator.submit", "omni.stage.started"): (
        "in-process stage: the request's task starts"
    ),
    ("omni.stage.started", "render.start"): (
        "vllm stage: the OpenAI body validated again (upstream's model)"
    ),
    ("render.end", "omni.engine.generate"): "vllm stage: SamplingParams",
    ("omni.engine.generate", "engine.generate"): "",
    ("response.start", "engine.generate"): "the stream's generator starts",
    ("engine.generate", "engine.add_request"): "AsyncLLM.generate starts",
    ("engine.generate", "response.start"): "the SSE response starts",
    ("response.start", "engine.add_request"): "AsyncLLM.generate starts",
    ("engine.add_request", "input.process"): "AsyncLLM: admission, to the processor",
    ("input.process", "input.processed"): "input processor (tokenization if text)",
    ("input.processed", "engine.added"): "to the engine core: output state, ZMQ send",
    ("engine.added", "core.output"): "EngineCore: schedule, prefill, first token",
    ("core.output", "detokenized"): "output processor: detokenization",
    ("detokenized", "engine.yield"): "collector to AsyncLLM.generate",
    ("engine.yield", "omni.engine.output"): "vllm stage receives it",
    ("omni.engine.output", "omni.stage.payload"): "vllm stage: output to payload",
    ("omni.stage.payload", "omni.orchestrator.received"): "in process: queued",
    ("omni.orchestrator.received", "omni.orchestrator.yield"): (
        "orchestrator: dispatch, request queue, its generator"
    ),
    ("omni.orchestrator.yield", "sse.write"): (
        "AsyncOmni and serving: delta, chunk, JSON, SSE framing"
    ),
    ("engine.yield", "sse.write"): "serving: delta, chunk, JSON, SSE framing",
    ("omni.orchestrator.yield", "response.start"): (
        "AsyncOmni, serving: the first output decides the status; headers"
    ),
    ("response.start", "sse.write"): "serving: delta, chunk, JSON, SSE framing",
    ("response.start", "omni.sse.chunk"): "serving: the body starts, the delta",
    ("omni.sse.chunk", "sse.write"): "JSON, SSE framing, the middlewares' send",
    ("client.send", "http.begin"): "client: request written, read by the server",
    ("sse.first", "client.first"): "client: the chunk read, JSON parsed",
    ("sse.write", "sse.first"): "ASGI send: the chunk to the socket",
}


def windows(marks: Iterable[Sequence[Any]]) -> list[list[tuple[str, int]]]:
    """Each request's marks, ``http.begin`` to its first ``sse.first``,
    each point at its first occurrence, in time order; requests without an
    SSE chunk (health checks, the marks themselves) are left out."""
    ordered = sorted(((str(p), int(ns)) for p, ns in marks), key=lambda m: m[1])
    found: list[list[tuple[str, int]]] = []
    current: dict[str, int] | None = None
    for point, ns in ordered:
        if point == "http.begin":
            current = {point: ns}
            continue
        if current is None or point in current:
            continue
        current[point] = ns
        if point == "sse.first":
            found.append(sorted(current.items(), key=lambda m: m[1]))
            current = None
    return found


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    side, rest = args[0], args[1:]
    if side == "omni":
        # Before vllm_omni is imported.
        os.environ["VLLM_OMNI_TRACE_HOPS"] = "1"
    install()
    if side == "upstream":
        sys.argv = ["vllm.entrypoints.openai.api_server", *rest]
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
        return
    if side != "omni":
        raise SystemExit(f"usage: http_marks upstream|omni ARGS… (not {side!r})")
    _install_omni()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *rest]
    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
