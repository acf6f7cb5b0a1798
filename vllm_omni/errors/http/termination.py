"""Stage-aware termination when the engine dies behind a request.

Owns applying upstream's ``terminate_if_errored`` and the one WARNING per
death that names the stage and says what upstream decided. Must not decide
itself whether the server exits: that rule (engine state,
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``) stays upstream's.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_omni import upstream
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.types import EngineDeadError, EngineGenerateError

__all__ = ["ENGINE_FAILURES", "terminate_if_errored"]

logger = logging.getLogger("vllm_omni.errors")

# Failures after which the engine may be dead: only these consult upstream.
ENGINE_FAILURES = (EngineDeadError, EngineGenerateError)


def terminate_if_errored(
    app: Any, exc: BaseException, details: OmniErrorDetails
) -> None:
    """Stage-aware ``terminate_if_errored``: upstream's rule, our log line.

    Upstream decides (engine state, ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``); the
    log line reports what it decided, naming the stage that died.
    """
    state = getattr(app, "state", None)
    server = getattr(state, "server", None)
    engine = getattr(state, "engine_client", None)
    if engine is None:
        return
    if server is not None and engine.errored:
        # Upstream's rule can only act on a dead engine, so its module (warmed
        # once the server is serving, vllm_omni.upstream) is needed only then.
        upstream.terminate_if_errored(server=server, engine=engine)
    if not (isinstance(exc, EngineDeadError) or details.fatal):
        return
    # Once per death: the engine keeps one dead error per death (an engine
    # client without one dies once). The orchestrator logged it CRITICAL.
    death = getattr(engine, "dead_error", None) if engine.errored else None
    key = death if death is not None else engine
    if getattr(state, "reported_death", None) is key:
        return
    state.reported_death = key
    logger.warning(
        "engine dead: stage %s failed fatally (first seen by request %s); %s",
        details.stage_id if details.stage_id is not None else "unknown",
        details.request_id,
        "shutting the API server down"
        if getattr(server, "should_exit", False)
        else "keeping the API server alive",
    )
