"""Every row of the status table survives a real stage process (§3, §6).

A ``raise`` fault makes stage 3 raise an instance of the row's class; the
record the orchestrator receives must equal ``normalize`` of the same
instance computed here, and the exception rebuilt from it must be the most
specific class the record names, caught by the row's own class wherever the
record can name it (and by the 0.30 wrappers, for one release).
Fatal rows kill their engine, so each gets its own.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from pathlib import Path
from typing import Any

import pytest
import vllm.exceptions

from tests.engine.engines import collect, write_pipeline
from vllm_omni.config import FaultConfig
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    OmniClientError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniServerError,
    VLLMError,
    VLLMNotFoundError,
    VLLMValidationError,
    normalize,
)
from vllm_omni.errors.table import LEGACY_FALLBACKS, STATUS_TABLE
from vllm_omni.errors.types import GRACEFUL_REBUILDS, REMOTE_TYPES

pytestmark = pytest.mark.timeout(60)

STAGE = 3
# Constructor arguments where the message alone is not enough (or not accepted).
ARGS: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "VLLMValidationError": (["max_tokens is too large"], {"parameter": "max_tokens"}),
    "VLLMUnprocessableEntityError": (
        ["image cannot be decoded"],
        {"parameter": "image"},
    ),
    "GuardrailViolationError": (["blocked"], {"parameter": "messages"}),
    "OmniClientError": (
        ["too large"],
        {"status_code": 413, "error_type": "PayloadTooLarge"},
    ),
    "OmniServerError": (
        ["upstream down"],
        {"status_code": 502, "error_type": "BadGateway"},
    ),
    "GracefulHTTPError": (["slow down"], {"http_status": 429}),
    "OmniStageTimeoutError": (["stage too slow"], {"stage_id": 1}),
    "EngineDeadError": ([], {}),
    "EngineFaultedError": ([], {}),  # vLLM 0.34+
    "OmniEngineDeadError": ([], {}),
    "Exception": (["secret at /etc/passwd"], {}),
}


def _spec(exc_type: type[BaseException]) -> FaultConfig:
    module = "builtins" if exc_type.__module__ == "builtins" else exc_type.__module__
    args, kwargs = ARGS.get(
        exc_type.__name__, ([f"{exc_type.__name__} in a stage"], {})
    )
    return FaultConfig(
        stage=STAGE,
        marker=f"@{exc_type.__name__}",
        action="raise",
        exception=f"{module}:{exc_type.__qualname__}",
        args=tuple(args),
        kwargs=kwargs,
    )


# The raw-exception rows exist only in legacy mode; stages normalize strictly,
# so there they are unknown server errors (500) like any other.
ROWS = [_spec(row.exc_type) for row in (*STATUS_TABLE, *LEGACY_FALLBACKS)]
STRICT_ONLY = {_spec(row.exc_type).exception for row in LEGACY_FALLBACKS}
FATAL = [s for s in ROWS if normalize(s.build_exception()).fatal]
NONFATAL = [s for s in ROWS if s not in FATAL]


def _document(faults: list[FaultConfig]) -> dict[str, Any]:
    return {
        "model": "omni-round-trip",
        "stages": [{"id": STAGE, "name": "thinker", "kind": "text"}],
        "faults": [
            {
                "stage": f.stage,
                "marker": f.marker,
                "action": f.action,
                "exception": f.exception,
                "args": list(f.args),
                "kwargs": dict(f.kwargs),
            }
            for f in faults
        ],
    }


def _expected_class(record: Any) -> type[VLLMError]:
    if record.fatal:
        return OmniEngineDeadError
    if record.faulted:  # vLLM 0.34+: the record names EngineFaultedError
        return GRACEFUL_REBUILDS[vllm.exceptions.EngineFaultedError]  # type: ignore[attr-defined]
    remote = REMOTE_TYPES.get((record.category, record.status_code, record.error_type))
    if remote is not None:
        return remote
    if record.category == "client":
        return OmniClientError
    if record.error_type == "InternalServerError":
        return OmniEngineGenerateError
    return OmniServerError


# Rows whose record cannot name their class, so a caller catches them by the
# class the record does name (docs/errors/python.md): a GenerationError's
# record is any stage 500 (EngineGenerateError), a RetryableRequestError's any
# 503 (OmniServiceUnavailableError), a GracefulHTTPError's only its status.
NOT_CAUGHT_BY_OWN_TYPE = {
    "GenerationError",
    "RetryableRequestError",
    "GracefulHTTPError",
}


def test_every_table_row_is_covered() -> None:
    assert len(ROWS) == len(STATUS_TABLE) + len(LEGACY_FALLBACKS)
    assert FATAL and NONFATAL
    for spec in ROWS:
        assert isinstance(spec.build_exception(), _resolve(spec.exception))


def _resolve(name: str | None) -> type:
    module, _, attr = (name or "").rpartition(":")
    return getattr(
        builtins if module == "builtins" else __import__(module, fromlist=[attr]), attr
    )


@pytest.fixture(scope="module")
async def engine(pipeline_dir: Path) -> Any:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, _document(NONFATAL))
    )
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("spec", NONFATAL, ids=lambda s: s.marker[1:])
async def test_nonfatal_row_round_trips(engine: AsyncOmni, spec: FaultConfig) -> None:
    request_id = f"rt-{spec.marker[1:]}"
    with pytest.raises(VLLMError) as info:
        await collect(engine, f"please {spec.marker}", request_id=request_id)
    expected = normalize(spec.build_exception(), request_id=request_id, stage_id=STAGE)
    assert info.value.details == expected  # type: ignore[attr-defined]
    assert type(info.value) is _expected_class(expected)
    # Catch by type: the row's own class catches what a stage raised (raw,
    # non-vLLM exceptions are unknown server errors, asserted above).
    raised_type = _resolve(spec.exception)
    if issubclass(raised_type, VLLMError):
        by_own_type = raised_type.__name__ not in NOT_CAUGHT_BY_OWN_TYPE
        assert isinstance(info.value, raised_type) is by_own_type
    if spec.exception in STRICT_ONLY:
        assert (expected.category, expected.status_code) == ("server", 500)
    assert not engine.errored


@pytest.mark.parametrize("spec", FATAL, ids=lambda s: s.marker[1:])
async def test_fatal_row_round_trips_and_kills_the_engine(
    pipeline_dir: Path, spec: FaultConfig
) -> None:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, _document([spec]))
    )
    try:
        pid = engine.stage_pids()[STAGE]
        request_id = f"rt-{spec.marker[1:]}"
        with pytest.raises(OmniEngineDeadError) as info:
            await collect(engine, f"please {spec.marker}", request_id=request_id)
        expected = normalize(
            spec.build_exception(), request_id=request_id, stage_id=STAGE
        )
        assert expected.fatal
        assert info.value.details == expected
        assert info.value.stage_id == STAGE
        await _exited(pid)
        await asyncio.sleep(0.3)
        assert engine.errored and engine.dead_error.stage_id == STAGE  # type: ignore[attr-defined]
    finally:
        engine.shutdown()


async def _exited(pid: int | None, timeout_s: float = 5.0) -> None:
    assert pid is not None
    for _ in range(int(timeout_s / 0.05)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"stage process {pid} did not exit")


async def test_a_legacy_wire_stage_is_read_by_status(pipeline_dir: Path) -> None:
    """A stage sending only the 0.30 flat fields (``legacy_wire``): the
    orchestrator reads the record by its status, 4xx and 5xx alike."""
    document = {
        "model": "omni-legacy",
        "stages": [{"id": 2, "name": "old", "kind": "text", "legacy_wire": True}],
        "faults": [
            {
                "stage": 2,
                "marker": "@404",
                "action": "raise",
                "exception": "vllm_omni.errors:VLLMNotFoundError",
                "args": ["no voice"],
            },
            {
                "stage": 2,
                "marker": "@400",
                "action": "raise",
                "exception": "vllm_omni.errors:VLLMValidationError",
                "args": ["bad"],
                "kwargs": {"parameter": "seed"},
            },
            {"stage": 2, "marker": "@500", "action": "raise"},
        ],
    }
    engine = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, document))
    try:
        with pytest.raises(VLLMNotFoundError) as not_found:
            await collect(engine, "@404", request_id="legacy-404")
        assert isinstance(not_found.value, OmniClientError)
        assert not_found.value.details is not None
        assert (not_found.value.details.category, not_found.value.status_code) == (
            "client",
            404,
        )
        assert not_found.value.details.message == "no voice"
        with pytest.raises(VLLMValidationError) as invalid:
            await collect(engine, "@400", request_id="legacy-400")
        # The legacy wire has no ``parameter``: it is lost, nothing else is.
        assert invalid.value.details is not None
        assert invalid.value.details.parameter is None
        assert invalid.value.details.stage_id == 2
        with pytest.raises(OmniEngineGenerateError) as failed:
            await collect(engine, "@500", request_id="legacy-500")
        assert failed.value.details is not None
        assert failed.value.details.category == "server" and failed.value.stage_id == 2
    finally:
        engine.shutdown()
