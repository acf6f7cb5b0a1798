"""The exception types (docs/design.md §2): re-exports by identity, the Omni tree,
the ``OmniClientError`` compatibility promise and the deprecated helpers."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import vllm_omni.errors as errors
from vllm_omni.errors import (
    EngineDeadError,
    EngineGenerateError,
    GuardrailViolationError,
    OmniClientError,
    OmniConflictError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniNotImplementedError,
    OmniServerError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMClientError,
    VLLMServerError,
    normalize,
)
from vllm_omni.errors.types import ENGINE_DEAD_MESSAGE

# -- re-exports ----------------------------------------------------------------

UPSTREAM_EXPORTS: list[tuple[str, str]] = [
    ("VLLMError", "vllm.exceptions"),
    ("VLLMClientError", "vllm.exceptions"),
    ("VLLMServerError", "vllm.exceptions"),
    ("VLLMValidationError", "vllm.exceptions"),
    ("VLLMNotFoundError", "vllm.exceptions"),
    ("VLLMUnprocessableEntityError", "vllm.exceptions"),
    ("GenerationError", "vllm.exceptions"),
    ("GracefulHTTPError", "vllm.exceptions"),
    ("EngineGenerateError", "vllm.v1.engine.exceptions"),
    ("EngineDeadError", "vllm.v1.engine.exceptions"),
]


@pytest.mark.parametrize(("name", "module"), UPSTREAM_EXPORTS)
def test_reexport_is_the_upstream_class(name: str, module: str) -> None:
    ours = getattr(errors, name)
    upstream = getattr(importlib.import_module(module), name)
    assert ours is upstream
    assert ours.__module__ == module


def test_every_public_name_resolves() -> None:
    for name in errors.__all__:
        assert getattr(errors, name) is not None
    assert set(errors.__all__) <= set(dir(errors))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        errors.NoSuchError  # noqa: B018


# -- the Omni tree -------------------------------------------------------------

OMNI_TYPES: list[tuple[type[BaseException], type[BaseException]]] = [
    (GuardrailViolationError, VLLMClientError),
    (OmniConflictError, VLLMClientError),
    (OmniNotImplementedError, VLLMServerError),
    (OmniServiceUnavailableError, VLLMServerError),
    (OmniStageTimeoutError, VLLMServerError),
    (OmniEngineGenerateError, EngineGenerateError),
    (OmniEngineDeadError, EngineDeadError),
    (OmniClientError, VLLMClientError),
    (OmniServerError, VLLMServerError),
]


@pytest.mark.parametrize(("omni_type", "parent"), OMNI_TYPES, ids=lambda t: t.__name__)
def test_omni_type_parent(
    omni_type: type[BaseException], parent: type[BaseException]
) -> None:
    assert issubclass(omni_type, parent)
    assert omni_type.__module__ == "vllm_omni.errors.types"
    # Client and server stay disjoint, as upstream's hierarchy intends.
    assert issubclass(omni_type, VLLMClientError) != issubclass(
        omni_type, VLLMServerError
    )


@pytest.mark.parametrize(
    ("omni_type", "status", "error_type"),
    [
        (GuardrailViolationError, 400, "GuardrailViolationError"),
        (OmniConflictError, 409, "ConflictError"),
        (OmniNotImplementedError, 501, "NotImplementedError"),
        (OmniServiceUnavailableError, 503, "ServiceUnavailableError"),
        (OmniStageTimeoutError, 504, "GatewayTimeoutError"),
        (OmniEngineGenerateError, 500, "InternalServerError"),
        (OmniEngineDeadError, 500, "InternalServerError"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_omni_type_class_data(omni_type: Any, status: int, error_type: str) -> None:
    assert omni_type.status_code == status
    assert omni_type.error_type == error_type


def test_engine_dead_error_keeps_log_text_and_client_message() -> None:
    exc = OmniEngineDeadError(stage_id=2, reason="CUDA out of memory")
    assert str(exc) == (
        "EngineCore encountered an issue. See stack trace (above) for the root "
        "cause. Stage 2 died (CUDA out of memory)"
    )
    assert exc.CLIENT_MESSAGE == (
        "The server had an error while processing your request."
    )
    assert str(OmniEngineDeadError()) == ENGINE_DEAD_MESSAGE == str(EngineDeadError())
    # vLLM 0.33+ names both texts on its class; before, they stand in here.
    if hasattr(EngineDeadError, "CLIENT_MESSAGE"):
        assert EngineDeadError.ENGINE_DEAD_MESSAGE is ENGINE_DEAD_MESSAGE
        assert EngineDeadError.CLIENT_MESSAGE is exc.CLIENT_MESSAGE
    assert OmniEngineDeadError(suppress_context=True).__suppress_context__ is True


def test_engine_generate_error_defaults() -> None:
    exc = OmniEngineGenerateError(stage_id=1)
    assert str(exc) == "Stage failed to process the request."
    assert (exc.stage_id, exc.details) == (1, None)


# -- OmniClientError compatibility (CHANGELOG: no longer a ValueError) ---------


def test_omni_client_error_is_not_a_value_error() -> None:
    assert not issubclass(OmniClientError, ValueError)
    assert not issubclass(GuardrailViolationError, ValueError)
    with pytest.raises(VLLMClientError):
        raise OmniClientError("x")


def test_omni_client_error_0_30_constructor() -> None:
    exc = OmniClientError(
        "Unknown voice 'zz'", status_code=404, error_type="NotFoundError"
    )
    assert (exc.message, exc.status_code, exc.error_type, exc.details) == (
        "Unknown voice 'zz'",
        404,
        "NotFoundError",
        None,
    )
    record = normalize(exc)
    assert (record.category, record.status_code, record.error_type) == (
        "client",
        404,
        "NotFoundError",
    )
    assert record.message == "Unknown voice 'zz'"
    default = OmniClientError("bad")
    assert (default.status_code, default.error_type) == (400, "BadRequestError")
    # A missing type follows the status (issue 13).
    untyped = _warns_here(
        lambda: errors.client_error_from_metadata(
            "busy", status_code=409, error_type=None
        )
    )
    assert untyped.error_type == "ConflictError"


@pytest.mark.parametrize("status", [200, 399, 500, 503, 600])
def test_omni_client_error_rejects_a_non_4xx_status(status: int) -> None:
    with pytest.raises(RuntimeError, match=f"needs a 4xx status, got {status}"):
        OmniClientError("x", status_code=status)


@pytest.mark.parametrize("status", [200, 404, 499, 600])
def test_omni_server_error_rejects_a_non_5xx_status(status: int) -> None:
    with pytest.raises(RuntimeError, match=f"needs a 5xx status, got {status}"):
        OmniServerError("x", status_code=status)


# -- deprecated helpers --------------------------------------------------------


def _warns_here(call: Callable[[], Any]) -> Any:
    """Run ``call``; it must emit one DeprecationWarning attributed to this file."""
    with pytest.warns(DeprecationWarning, match="is deprecated") as caught:
        result = call()
    assert [w.filename for w in caught] == [__file__]
    return result


def test_client_error_metadata() -> None:
    exc = OmniClientError("x", status_code=409, error_type="ConflictError")
    assert _warns_here(lambda: errors.client_error_metadata(exc)) == (
        409,
        "ConflictError",
    )
    plain = ValueError("x")
    assert _warns_here(lambda: errors.client_error_metadata(plain)) == (None, None)


def test_client_error_from_metadata() -> None:
    exc = _warns_here(
        lambda: errors.client_error_from_metadata(
            "gone", status_code=404, error_type="NotFoundError"
        )
    )
    assert type(exc) is OmniClientError
    assert (exc.message, exc.status_code, exc.error_type) == (
        "gone",
        404,
        "NotFoundError",
    )
    default = _warns_here(
        lambda: errors.client_error_from_metadata(
            "x", status_code=None, error_type=None
        )
    )
    assert (default.status_code, default.error_type) == (400, "BadRequestError")
    # A missing type follows the status (issue 13).
    untyped = _warns_here(
        lambda: errors.client_error_from_metadata(
            "busy", status_code=409, error_type=None
        )
    )
    assert untyped.error_type == "ConflictError"


@pytest.mark.parametrize(
    ("status", "expected"),
    [(400, True), (404, True), (499, True), (399, False), (500, False), (None, False)],
)
def test_is_client_error_status(status: int | None, expected: bool) -> None:
    assert _warns_here(lambda: errors.is_client_error_status(status)) is expected


def test_raise_client_error_or_raises_client_error_for_4xx() -> None:
    def call() -> None:
        errors.raise_client_error_or(
            "no such job", status_code=404, error_type=None, fallback=RuntimeError
        )

    with pytest.raises(OmniClientError) as info:
        _warns_here(call)
    assert (info.value.message, info.value.status_code, info.value.error_type) == (
        "no such job",
        404,
        "NotFoundError",
    )


@pytest.mark.parametrize("status", [500, None])
def test_raise_client_error_or_raises_fallback_otherwise(status: int | None) -> None:
    def call() -> None:
        errors.raise_client_error_or(
            "stage died", status_code=status, error_type="X", fallback=RuntimeError
        )

    with pytest.raises(RuntimeError, match=r"^stage died$") as info:
        _warns_here(call)
    assert type(info.value) is RuntimeError


def test_helpers_warn_on_every_call() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            errors.is_client_error_status(400)
    assert [w.category for w in caught] == [DeprecationWarning] * 3


# -- the rest of the 0.30 surface (issue 22) ------------------------------------


def test_the_030_dead_error_form_still_builds_one() -> None:
    """0.30 wrote ``OmniEngineDeadError(message, error_stage_id=N)``; its
    message was the cause of the death, ``reason`` here."""
    dead = _warns_here(lambda: OmniEngineDeadError("gpu fell off", error_stage_id=2))
    assert (dead.stage_id, dead.reason) == (2, "gpu fell off")
    assert str(dead).endswith("Stage 2 died (gpu fell off)")
    details = normalize(dead)
    assert (details.stage_id, details.fatal, details.status_code) == (2, True, 500)
    assert _warns_here(lambda: OmniEngineDeadError(error_stage_id=0)).stage_id == 0


@pytest.mark.parametrize(
    "build",
    [
        lambda: OmniEngineDeadError(stage_id=1, error_stage_id=2),
        lambda: OmniEngineDeadError("b", reason="a"),
    ],
    ids=["stage twice", "reason twice"],
)
def test_the_030_dead_error_form_and_the_new_one_do_not_mix(
    build: Callable[[], Any],
) -> None:
    with pytest.raises(RuntimeError, match=r"not also their 0\.30 forms"):
        build()


@pytest.mark.parametrize(
    "exc",
    [
        OmniEngineDeadError(stage_id=3),
        OmniEngineGenerateError("x", stage_id=3),
        OmniStageTimeoutError("x", stage_id=3),
        OmniServiceUnavailableError("x", stage_id=3),
        errors.to_exception(
            errors.OmniErrorDetails("x", "client", 413, "TooLarge", stage_id=3)
        ),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_error_stage_id_is_the_stage_id(exc: Any) -> None:
    assert _warns_here(lambda: exc.error_stage_id) == 3


def test_error_stage_id_of_an_error_without_a_stage_is_none() -> None:
    assert _warns_here(lambda: OmniClientError("x").error_stage_id) is None
