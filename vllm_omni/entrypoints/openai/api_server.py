"""The OpenAI-compatible API server, in the style of ``vllm serve``.

``build_app`` assembles the FastAPI app: routers (each behind the API-key
dependency and the check that all client text is Unicode), the error
boundary, the Prometheus instrumentator mounted the way vLLM mounts it, and
``/openapi.json`` narrowed to the engine's pipeline (``openapi.served``).
``init_app_state`` hangs the engine client and the job store on
``app.state``. ``run_server`` serves a started engine with uvicorn, and shuts
everything down in order.

This module wires things together; it owns no route logic and builds no
error responses (routes raise, ``vllm_omni.errors`` renders).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import importlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import uvicorn
import vllm.envs as vllm_envs
from fastapi import Depends, FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.openai.admission import admit_before_routing
from vllm_omni.entrypoints.openai.auth import (
    authenticate_before_body,
    authenticate_documents,
    require_api_key,
)
from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.entrypoints.openai.metering import instrument
from vllm_omni.entrypoints.openai.unicode import require_unicode
from vllm_omni.errors.http import ERROR_RESPONSES, install_error_handling
from vllm_omni.errors.sanitize import warm_rule_set
from vllm_omni.tracing.provider import enabled as tracing_enabled
from vllm_omni.upstream import launcher

__all__ = ["build_app", "init_app_state", "route_modules", "run_server"]

logger = logging.getLogger("vllm_omni.server")

# Operational endpoints the instrumentator leaves out, as vLLM does (and
# the traces too).
_UNMETERED = ["/metrics", "/health"]
_EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_UVICORN_WS_MAX_SIZE = 16 * 1024 * 1024
# ``vllm serve`` frontend arguments passed to uvicorn under the same name.
_UVICORN_SETTINGS = (
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "ssl_ciphers",
    "h11_max_incomplete_event_size",
)

# Route modules: each has ``router``, optionally ``PUBLIC`` (no API key) and
# ``init_state(app, args)`` / ``shutdown_state(app)`` hooks.
_ROUTERS = (
    "vllm_omni.entrypoints.openai.routes.health",
    "vllm_omni.entrypoints.openai.routes.models",
    "vllm_omni.entrypoints.openai.routes.chat",
    "vllm_omni.entrypoints.openai.routes.completions",
    "vllm_omni.entrypoints.openai.routes.audio",
    "vllm_omni.entrypoints.openai.routes.images",
    "vllm_omni.entrypoints.openai.routes.videos",
    "vllm_omni.entrypoints.openai.routes.realtime",
    "vllm_omni.entrypoints.openai.routes.fault_tolerance",
)
# ``/openapi.json`` narrowed to the pipeline. It reads the request models,
# which load upstream's protocol modules (and with them ``vllm.config``, 3-4 s):
# like the routers it is imported by name when the app is built, after
# ``vllm-omni serve`` warmed both in a thread (``route_modules``).
_OPENAPI = "vllm_omni.entrypoints.openai.openapi"


def route_modules() -> list[Any]:
    """Every installed route module, imported, and ``openapi`` with them. They
    import vLLM's serving code (seconds of work, most of it holding the GIL):
    ``vllm-omni serve`` calls this in a thread before it builds the app, so
    that the engine's loop (stage heartbeats, stage messages) never waits."""
    modules = []
    for name in _ROUTERS:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            logger.warning("route module %s is not installed; skipping it", name)
    importlib.import_module(_OPENAPI)
    return modules


async def _run_hooks(app: FastAPI, hook: str, *args: Any) -> None:
    """Call ``hook`` (``init_state`` / ``shutdown_state``) on every route module
    that has it, awaiting it when it is a coroutine function."""
    for module in app.state.route_modules:
        function: Callable[..., Any] | None = getattr(module, hook, None)
        if function is not None:
            result = function(app, *args)
            if asyncio.iscoroutine(result):
                await result


def build_app(args: argparse.Namespace) -> FastAPI:
    """The app with every router, the error boundary and the metrics."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await _run_hooks(app, "shutdown_state")

    app = FastAPI(title="vLLM-Omni", lifespan=lifespan)
    app.state.api_keys = _api_keys(getattr(args, "api_key", None))
    app.state.route_modules = route_modules()
    # Every route, public ones included, refuses text that is not Unicode;
    # the key is checked first (before the body is read, see auth).
    unicode = [Depends(require_unicode)]
    auth = [Depends(require_api_key)]
    for module in app.state.route_modules:
        public = getattr(module, "PUBLIC", False)
        app.include_router(
            module.router,
            dependencies=unicode if public else auth + unicode,
            responses=ERROR_RESPONSES,
        )
    authenticate_before_body(app)
    app.state.limits = RequestLimits.from_args(args)
    install_error_handling(
        app,
        mode=args.error_mode,
        max_request_bytes=app.state.limits.max_request_bytes,
        max_ws_message_bytes=app.state.limits.max_ws_message_bytes,
    )
    if tracing_enabled():
        # Only then: with tracing off nothing of OpenTelemetry is imported.
        from vllm_omni.tracing.asgi import install_tracing

        install_tracing(app, excluded=_UNMETERED)
    origins = getattr(args, "allowed_origins", None)
    if origins:
        # Outermost, as in ``vllm serve``: error responses carry CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials=args.allow_credentials,
            allow_methods=args.allowed_methods,
            allow_headers=args.allowed_headers,
        )
    instrumentator = instrument(app, excluded=_UNMETERED)
    if (getattr(args, "api_server_count", None) or 1) > 1:
        # One of several API server processes: the sums over all of them.
        from vllm_omni.entrypoints.engine_rpc.metrics import metrics_endpoint

        app.add_route("/metrics", metrics_endpoint, include_in_schema=False)
    else:
        instrumentator.expose(
            app, response_class=_PrometheusResponse, include_in_schema=False
        )
    openapi = importlib.import_module(_OPENAPI)
    app.openapi = functools.partial(openapi.served, app)  # type: ignore[method-assign]
    # FastAPI's /openapi.json route, replaced by one that awaits the document.
    app.router.routes[:] = [
        r for r in app.router.routes if getattr(r, "path", None) != app.openapi_url
    ]
    app.add_route(str(app.openapi_url), openapi.endpoint, include_in_schema=False)
    authenticate_documents(app)
    # Last: the one middleware inside the error boundary, once every route is known.
    admit_before_routing(app)
    return app


def _api_keys(value: str | Sequence[str] | None) -> tuple[bytes, ...]:
    """``--api-key``: one key (``vllm-omni serve``, ``$VLLM_OMNI_API_KEY``) or
    several (vLLM's parser)."""
    if not value:
        return ()
    keys = [value] if isinstance(value, str) else list(value)
    return tuple(key.encode() for key in keys if key)


def _uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """The frontend arguments of ``vllm serve`` that are uvicorn settings
    (absent from a namespace that did not come from vLLM's parser), and the
    idle keep-alive ``vllm serve`` takes from ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``
    (an operator behind a load balancer raises it above the balancer's)."""
    options: dict[str, Any] = {
        name: getattr(args, name)
        for name in _UVICORN_SETTINGS
        if getattr(args, name, None) is not None
    }
    options["timeout_keep_alive"] = vllm_envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    if getattr(args, "root_path", None):
        options["root_path"] = args.root_path
    if getattr(args, "disable_uvicorn_access_log", False):
        options["access_log"] = False
    return options


class _PrometheusResponse(Response):
    media_type = "text/plain; version=0.0.4; charset=utf-8"


async def init_app_state(
    app: FastAPI, engine: AsyncOmni, args: argparse.Namespace
) -> None:
    """Attach the engine and let each route module set up its own state."""
    app.state.engine_client = engine
    app.state.args = args
    await _run_hooks(app, "init_state", args)
    importlib.import_module(_OPENAPI).prepare(app)


async def run_server(
    args: argparse.Namespace,
    engine: AsyncOmni,
    *,
    exit_signals: Sequence[signal.Signals] = _EXIT_SIGNALS,
) -> int:
    """Serve ``engine`` (started by ``vllm-omni serve``, which overlaps its
    start with this module's import) until told to stop or the engine dies;
    shuts the engine down in every case.

    Returns the process exit code: 1 when the engine died, else 0.
    ``exit_signals`` stop it gracefully (one of several API server
    processes leaves SIGINT to the engine process, which stops it).
    """
    try:
        app = build_app(args)
        await init_app_state(app, engine, args)
        # As ``vllm serve`` does: the start-up heap is never collected again,
        # so collections while serving are short (see ``_freeze_heap``).
        _freeze_heap()
        logger.info("froze %d start-up objects out of GC", gc.get_freeze_count())
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.uvicorn_log_level,
            timeout_graceful_shutdown=5,
            ws_max_size=_ws_max_size(app),
            **_uvicorn_options(args),
        )
        # uvicorn's own handlers re-raise SIGINT/SIGTERM once serve() returns,
        # killing the process before the stages are shut down below; like
        # vLLM's launcher, handle the signals on the loop instead.
        server = _LoopSignalServer(config)
        app.state.server = server
        loop = asyncio.get_running_loop()
        for sig in exit_signals:
            loop.add_signal_handler(sig, _request_exit, server)
        watchdog = asyncio.create_task(_watch_engine(server, engine))
        freeze = asyncio.create_task(_freeze_when_warm(app))
        logger.info(
            "vllm-omni serving %s on http://%s:%d (error mode %s, event loop %s)",
            engine.model_name,
            args.host,
            args.port,
            args.error_mode,
            type(loop).__module__,
        )
        # The socket ``vllm-omni serve`` bound before startup for this
        # process, if any (``serve._bind``, ``api_servers``).
        listening = getattr(args, "listen_sockets", None)
        try:
            await server.serve(sockets=listening or None)
        finally:
            watchdog.cancel()
            freeze.cancel()
            for sig in exit_signals:
                loop.remove_signal_handler(sig)
        return 1 if engine.errored else 0
    finally:
        engine.shutdown()


def _freeze_heap() -> None:
    """Leave every object alive now out of later garbage collections.

    Like ``vllm serve`` (upstream's ``freeze_gc_heap``): a full collection
    walks every object vLLM, torch and the app created at start-up, and held
    this loop 0.8 to 2 s at a time under load (docs/performance.md, the
    soak's stall). Only the young generations are collected first: a full
    collection here would be one such pause, to free a few dozen objects
    (measured), which stay frozen instead.
    """
    gc.collect(0)
    gc.collect(1)
    gc.freeze()


async def _freeze_when_warm(app: FastAPI) -> None:
    """Freeze again once what start-up leaves to threads is built: upstream's
    launcher module, the sanitizer's rule set, the served ``/openapi.json``
    (seconds on a loaded host, while requests are already served)."""
    await asyncio.to_thread(launcher)
    await asyncio.to_thread(warm_rule_set().join)
    built: asyncio.Task[Any] | None = getattr(app.state, "openapi_task", None)
    if built is not None:
        await asyncio.wait([built])
    _freeze_heap()
    logger.debug("start-up heap frozen: %d objects", gc.get_freeze_count())


def _ws_max_size(app: FastAPI) -> int:
    """uvicorn's cap on a WebSocket message, above ours so that ours decides.

    A message between our limit and this cap is read and answered with the
    canonical error event (the error boundary); past the cap the protocol
    layer closes with 1009 without reading further. uvicorn's default (16 MiB)
    unless our limit needs more room.
    """
    limit: int = app.state.limits.max_ws_message_bytes
    return max(_UVICORN_WS_MAX_SIZE, 2 * limit)


class _LoopSignalServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to the event loop.

    Upstream's ``NoSignalServer`` does the same, but its module imports
    ``vllm.config`` (3–4 s), which the server would wait for before
    ``/health``; the error boundary imports that module in a thread at
    startup (``vllm_omni.upstream.warm_launcher``), for
    ``terminate_if_errored``.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _request_exit(server: uvicorn.Server) -> None:
    """First signal: graceful shutdown; a second: stop waiting for requests."""
    if server.should_exit:
        server.force_exit = True
    server.should_exit = True


async def _watch_engine(server: uvicorn.Server, engine: AsyncOmni) -> None:
    """Engine death with no request in flight still stops the server.

    Requests that see the death trigger termination themselves (the error
    boundary); this watchdog covers a stage that dies while the server is
    idle, with upstream's ``terminate_if_errored`` rule.
    """
    while not engine.errored:
        await asyncio.sleep(0.2)
    # The orchestrator logged the death (CRITICAL, once); this is the decision
    # (upstream's module, loaded off the loop if startup has not yet).
    rule = await asyncio.to_thread(launcher)
    rule.terminate_if_errored(server=server, engine=engine)
    logger.warning(
        "engine dead: %s",
        "shutting the API server down"
        if server.should_exit
        else "keeping the API server alive (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)",
    )
