"""Exceptions as a Python caller meets them (issue 13): pickle, copy, repr, types.

Table-driven over every public exception type of ``vllm_omni.errors``: each
survives ``pickle`` (every protocol), ``copy`` and ``deepcopy`` with its
message, attributes and ``.details``, also through real process pools. The
upstream types that cannot are pinned (a test fails when upstream fixes
them) and ``for_caller`` hands callers a picklable rebuild instead.
"""

from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import pickle
from collections.abc import Callable
from http import HTTPStatus

import pytest
from vllm.exceptions import (
    LoRAAdapterNotFoundError,
    MaxQueuedTokensError,
    QueueOverflowError,
)

from tests.errors.upstream_since import newer
from vllm_omni import errors
from vllm_omni.errors import (
    EngineDeadError,
    EngineGenerateError,
    GenerationError,
    GracefulHTTPError,
    GuardrailViolationError,
    OmniClientError,
    OmniConflictError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniErrorDetails,
    OmniNotImplementedError,
    OmniServerError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
    for_caller,
    normalize,
    to_exception,
)
from vllm_omni.errors.types import (
    REMOTE_TYPES,
    UNPICKLABLE_UPSTREAM,
    RemoteMaxQueuedTokensError,
    RemoteQueueOverflowError,
)


def _remote(category: str, status: int, error_type: str) -> Callable[[], VLLMError]:
    return lambda: to_exception(
        OmniErrorDetails(
            "from a stage",
            category,  # type: ignore[arg-type]
            status,
            error_type,
            parameter="voice" if category == "client" else None,
            request_id="req-7",
            stage_id=2,
        )
    )


# One instance of every public exception type, as our code or a caller builds it.
FACTORIES: dict[str, Callable[[], BaseException]] = {
    "VLLMError": lambda: VLLMError("plain"),
    "VLLMClientError": lambda: VLLMClientError("bad request"),
    "VLLMServerError": lambda: VLLMServerError("server failed"),
    "VLLMValidationError": lambda: VLLMValidationError(
        "temperature must be >= 0", parameter="temperature", value=-1
    ),
    "VLLMNotFoundError": lambda: VLLMNotFoundError("no such voice"),
    "VLLMUnprocessableEntityError": lambda: VLLMUnprocessableEntityError(
        "image cannot be decoded", parameter="image"
    ),
    "GenerationError": lambda: GenerationError("kv transfer failed"),
    "EngineGenerateError": lambda: EngineGenerateError("request failed"),
    "GuardrailViolationError": lambda: GuardrailViolationError(
        "blocked", parameter="messages"
    ),
    "OmniConflictError": lambda: OmniConflictError("job is running"),
    "OmniNotImplementedError": lambda: OmniNotImplementedError("not yet"),
    "OmniServiceUnavailableError": lambda: OmniServiceUnavailableError("no stage"),
    "OmniStageTimeoutError": lambda: OmniStageTimeoutError("late", stage_id=1),
    "OmniEngineGenerateError": lambda: OmniEngineGenerateError("failed", stage_id=2),
    "OmniEngineDeadError": lambda: OmniEngineDeadError(stage_id=2, reason="r"),
    "OmniClientError": lambda: OmniClientError("gone", status_code=404),
    "OmniServerError": lambda: OmniServerError("bad gateway", status_code=502),
    **{
        remote.__name__: _remote(*key)  # type: ignore[misc]
        for key, remote in REMOTE_TYPES.items()
    },
    # vLLM 0.32+ (tests.errors.upstream_since): only where it is defined.
    **(
        {}
        if (RetryableRequestError := newer("RetryableRequestError")) is None
        else {"RetryableRequestError": RetryableRequestError}
    ),
    "LoRAAdapterNotFoundError": lambda: LoRAAdapterNotFoundError("a", "/x"),
    # Upstream types that do not survive pickle (UNPICKLABLE_UPSTREAM).
    "EngineDeadError": lambda: EngineDeadError(),
    "GracefulHTTPError": lambda: GracefulHTTPError("busy", HTTPStatus.CONFLICT),
    "QueueOverflowError": lambda: QueueOverflowError(),
}
BROKEN_UPSTREAM = {
    "EngineDeadError",
    "GracefulHTTPError",
    "QueueOverflowError",
}
PICKLABLE = sorted(set(FACTORIES) - BROKEN_UPSTREAM)


def test_every_public_exception_type_is_in_the_table() -> None:
    public = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), BaseException)
    }
    assert public <= set(FACTORIES)
    for name, factory in FACTORIES.items():
        assert type(factory()).__name__ == name


def _same(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b)
    assert a.args == b.args
    assert str(a) == str(b)
    assert vars(a) == vars(b)
    assert getattr(a, "details", None) == getattr(b, "details", None)


def _copies(exc: BaseException) -> list[BaseException]:
    pickled = [
        pickle.loads(pickle.dumps(exc, protocol=protocol))
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    ]
    return [*pickled, copy.copy(exc), copy.deepcopy(exc)]


@pytest.mark.parametrize("name", PICKLABLE)
def test_pickle_copy_and_deepcopy_keep_everything(name: str) -> None:
    exc = FACTORIES[name]()
    for clone in _copies(exc):
        _same(clone, exc)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_what_the_apis_raise_pickles_with_details(name: str) -> None:
    raised = for_caller(FACTORIES[name](), request_id="req-1")  # type: ignore[arg-type]
    assert isinstance(raised.details, OmniErrorDetails)  # type: ignore[attr-defined]
    assert raised.details.request_id in ("req-1", "req-7")  # type: ignore[attr-defined]
    assert normalize(raised) == raised.details  # type: ignore[attr-defined]
    for clone in _copies(raised):
        _same(clone, raised)
        assert clone.details == raised.details  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(BROKEN_UPSTREAM))
def test_upstream_types_that_still_do_not_round_trip(name: str) -> None:
    """When this fails, upstream fixed the type: drop it from
    ``UNPICKLABLE_UPSTREAM`` and from docs/errors/python.md."""
    exc = FACTORIES[name]()
    assert isinstance(exc, UNPICKLABLE_UPSTREAM)
    try:
        clone = pickle.loads(pickle.dumps(exc))
    except TypeError:
        return
    assert clone.args != exc.args  # EngineDeadError doubles its args


def test_upstream_types_are_replaced_by_a_rebuild_that_keeps_the_record() -> None:
    busy = QueueOverflowError()
    raised = for_caller(busy, request_id="req-2")
    assert type(raised) is RemoteQueueOverflowError
    assert isinstance(raised, QueueOverflowError | OmniServerError)
    assert raised.details == normalize(busy, request_id="req-2")  # type: ignore[attr-defined]
    assert (raised.status_code, raised.error_type) == (503, "Service Unavailable")  # type: ignore[attr-defined]
    assert (raised.message, raised.http_status) == (busy.message, busy.http_status)
    backlog = for_caller(MaxQueuedTokensError())
    assert type(backlog) is RemoteMaxQueuedTokensError
    assert isinstance(backlog, MaxQueuedTokensError)
    for rebuilt in (raised, backlog):
        clone = pickle.loads(pickle.dumps(rebuilt))
        assert type(clone) is type(rebuilt)
        assert clone.details == rebuilt.details  # type: ignore[attr-defined]
        assert for_caller(clone) is clone
    dead = for_caller(EngineDeadError())
    assert type(dead) is OmniEngineDeadError and dead.details.fatal  # type: ignore[attr-defined]


def test_an_unknown_exception_becomes_a_server_error_with_details() -> None:
    raised = for_caller(TypeError("'int' object is not iterable"), request_id="r")
    assert type(raised) is OmniServerError
    assert raised.details == OmniErrorDetails(  # type: ignore[attr-defined]
        errors.GENERIC_SERVER_MESSAGE,
        "server",
        500,
        "InternalServerError",
        request_id="r",
    )


# -- real process pools ------------------------------------------------------------


def _raise(name: str, for_api: bool) -> None:
    exc = FACTORIES[name]()
    raise for_caller(exc, request_id="req-9") if for_api else exc  # type: ignore[arg-type]


POOL_CASES = [(name, False) for name in PICKLABLE] + [
    (name, True) for name in sorted(BROKEN_UPSTREAM)
]


@pytest.fixture(scope="module")
def process_pool() -> concurrent.futures.ProcessPoolExecutor:
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("fork")
    ) as pool:
        yield pool  # type: ignore[misc]


@pytest.fixture(scope="module")
def mp_pool() -> multiprocessing.pool.Pool:
    with multiprocessing.get_context("fork").Pool(1) as pool:
        yield pool  # type: ignore[misc]


@pytest.mark.parametrize(("name", "for_api"), POOL_CASES)
def test_process_pool_executor_hands_back_the_exception(
    process_pool: concurrent.futures.ProcessPoolExecutor, name: str, for_api: bool
) -> None:
    expected = FACTORIES[name]()
    if for_api:
        expected = for_caller(expected, request_id="req-9")  # type: ignore[arg-type]
    with pytest.raises(type(expected)) as caught:
        process_pool.submit(_raise, name, for_api).result(timeout=60)
    assert caught.value.args == expected.args
    assert getattr(caught.value, "details", None) == getattr(expected, "details", None)


@pytest.mark.parametrize(("name", "for_api"), POOL_CASES)
def test_multiprocessing_pool_hands_back_the_exception(
    mp_pool: multiprocessing.pool.Pool, name: str, for_api: bool
) -> None:
    expected = FACTORIES[name]()
    if for_api:
        expected = for_caller(expected, request_id="req-9")  # type: ignore[arg-type]
    with pytest.raises(type(expected)) as caught:
        mp_pool.apply_async(_raise, (name, for_api)).get(timeout=60)
    assert str(caught.value) == str(expected)
    assert getattr(caught.value, "details", None) == getattr(expected, "details", None)


# -- repr, types from status ----------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (
            OmniClientError("gone", status_code=404),
            "OmniClientError('gone', status_code=404, error_type='NotFoundError', "
            "stage_id=None)",
        ),
        (
            OmniStageTimeoutError("late", stage_id=1),
            "OmniStageTimeoutError('late', status_code=504, "
            "error_type='GatewayTimeoutError', stage_id=1)",
        ),
        (
            OmniEngineDeadError(stage_id=2, reason="gpu fell off"),
            "OmniEngineDeadError('EngineCore encountered an issue. See stack trace "
            "(above) for the root cause. Stage 2 died (gpu fell off)', "
            "status_code=500, error_type='InternalServerError', stage_id=2)",
        ),
        (
            to_exception(
                OmniErrorDetails("no voice", "client", 404, "NotFoundError", stage_id=3)
            ),
            "RemoteVLLMNotFoundError('no voice', status_code=404, "
            "error_type='NotFoundError', stage_id=3)",
        ),
    ],
)
def test_repr_shows_class_status_type_and_stage(exc: BaseException, text: str) -> None:
    assert repr(exc) == text


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "BadRequestError"),
        (404, "NotFoundError"),
        (409, "ConflictError"),
        (422, "UnprocessableEntityError"),
        (429, "RateLimitError"),
    ],
)
def test_omni_client_error_type_follows_its_status(
    status: int, error_type: str
) -> None:
    exc = OmniClientError("x", status_code=status)
    assert exc.error_type == error_type
    assert normalize(exc).error_type == error_type


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (500, "InternalServerError"),
        (501, "NotImplementedError"),
        (503, "ServiceUnavailableError"),
        (504, "GatewayTimeoutError"),
    ],
)
def test_omni_server_error_type_follows_its_status(
    status: int, error_type: str
) -> None:
    assert normalize(OmniServerError("x", status_code=status)).error_type == error_type


# -- catch by type ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "semantic", "wrapper"),
    [
        (
            OmniErrorDetails("bad", "client", 400, "BadRequestError", parameter="n"),
            VLLMValidationError,
            OmniClientError,
        ),
        (
            OmniErrorDetails("gone", "client", 404, "NotFoundError"),
            VLLMNotFoundError,
            OmniClientError,
        ),
        (
            OmniErrorDetails("bad image", "client", 422, "UnprocessableEntityError"),
            VLLMUnprocessableEntityError,
            OmniClientError,
        ),
        (
            OmniErrorDetails("no", "client", 400, "GuardrailViolationError"),
            GuardrailViolationError,
            OmniClientError,
        ),
        (
            OmniErrorDetails("busy", "client", 409, "ConflictError"),
            OmniConflictError,
            OmniClientError,
        ),
        (
            OmniErrorDetails("no", "server", 501, "NotImplementedError"),
            OmniNotImplementedError,
            OmniServerError,
        ),
        (
            OmniErrorDetails("down", "server", 503, "ServiceUnavailableError"),
            OmniServiceUnavailableError,
            OmniServerError,
        ),
        (
            OmniErrorDetails("late", "server", 504, "GatewayTimeoutError", stage_id=1),
            OmniStageTimeoutError,
            OmniServerError,
        ),
        (
            OmniErrorDetails("x", "server", 500, "InternalServerError", stage_id=1),
            OmniEngineGenerateError,
            VLLMServerError,
        ),
    ],
)
def test_a_record_is_caught_by_its_semantic_type_and_its_wrapper(
    record: OmniErrorDetails, semantic: type[VLLMError], wrapper: type[VLLMError]
) -> None:
    with pytest.raises(semantic) as caught:
        raise to_exception(record)
    assert isinstance(caught.value, wrapper)
    assert caught.value.details == record  # type: ignore[attr-defined]
    if record.parameter is not None:
        assert caught.value.parameter == record.parameter  # type: ignore[attr-defined]
    if record.stage_id is not None:
        assert caught.value.stage_id == record.stage_id  # type: ignore[attr-defined]


def test_a_stage_timeout_record_is_caught_like_the_orchestrator_deadline() -> None:
    record = OmniErrorDetails("late", "server", 504, "GatewayTimeoutError", stage_id=1)
    for raised in (to_exception(record), OmniStageTimeoutError("late", stage_id=1)):
        with pytest.raises(OmniStageTimeoutError):
            raise raised


def test_a_fatal_record_keeps_its_reason() -> None:
    record = OmniErrorDetails(
        errors.GENERIC_SERVER_MESSAGE,
        "server",
        500,
        "InternalServerError",
        stage_id=2,
        fatal=True,
    )
    dead = to_exception(record, reason="gpu fell off")
    assert isinstance(dead, OmniEngineDeadError)
    assert dead.reason == "gpu fell off" and "gpu fell off" in str(dead)
    assert pickle.loads(pickle.dumps(dead)).reason == "gpu fell off"
    assert errors.fatal_reason(OmniEngineDeadError(reason="at /srv/x.py")) == (
        "at <path>"
    )
    assert errors.fatal_reason(EngineDeadError()) == "EngineDeadError"
