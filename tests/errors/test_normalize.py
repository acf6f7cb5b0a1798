"""``normalize`` / ``to_exception`` (docs/design.md §2, §3): the status table as a
literal expectation, checked against upstream's ``create_error_response``, and
the invariants of every record ``normalize`` returns for any exception."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import re
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import msgspec
import pytest
import vllm
import vllm.outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.entrypoints.serve.exception_handling.error_response import (
    create_error_response,
)
from vllm.exceptions import (
    LoRAAdapterNotFoundError,
    MaxQueuedTokensError,
    QueueOverflowError,
)

from tests.errors.upstream_since import lacks, newer
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
    RemoteOmniServiceUnavailableError,
    RemoteOmniStageTimeoutError,
    RemoteVLLMNotFoundError,
    RemoteVLLMValidationError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
    from_request_error,
    is_legacy_fallback,
    normalize,
    sanitize_message,
    to_exception,
)
from vllm_omni.errors.types import ENGINE_DEAD_CLIENT_MESSAGE, REMOTE_TYPES

GENERIC = "The server had an error while processing your request."
PARAMETER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]-]{0,127}$")

# -- the status table, written out --------------------------------------------
#
# Each expectation is a literal (not read from vllm_omni.errors.table), so a
# changed row fails here until the contract itself is changed.


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], BaseException]
    status: int
    error_type: str
    category: str
    message: str
    parameter: str | None = None
    fatal: bool = False
    stage_id: int | None = None


# Upstream classes only newer vLLM releases define (UPSTREAM_SINCE): the
# class, or a maker that skips its case where the installed vLLM lacks it.
def _newer(name: str) -> Callable[..., BaseException]:
    found = newer(name)
    if found is not None:
        return found

    def missing(*args: object) -> BaseException:
        pytest.skip(lacks(name))

    return missing


ChatTemplateResolutionError = _newer("ChatTemplateResolutionError")
ProfilerAlreadyActiveError = _newer("ProfilerAlreadyActiveError")
RetryableRequestError = _newer("RetryableRequestError")


UPSTREAM_CASES: list[Case] = [
    Case(
        "validation",
        lambda: VLLMValidationError(
            "temperature must be in [0, 2]", parameter="temperature", value=5
        ),
        400,
        "BadRequestError",
        "client",
        "temperature must be in [0, 2]",
        parameter="temperature",
    ),
    Case(
        "unprocessable",
        lambda: VLLMUnprocessableEntityError(
            "Cannot load the image", parameter="messages.0.content", value=b"\x89P"
        ),
        422,
        "UnprocessableEntityError",
        "client",
        "Cannot load the image",
        parameter="messages.0.content",
    ),
    Case(
        "not-found",
        lambda: VLLMNotFoundError("The model `foo` does not exist."),
        404,
        "NotFoundError",
        "client",
        "The model `foo` does not exist.",
    ),
    Case(
        "lora-not-found",
        lambda: LoRAAdapterNotFoundError("sql", "/root/adapters/sql"),
        404,
        "NotFoundError",
        "client",
        "Loading lora sql failed: No adapter found for <path>",
    ),
    Case(
        "chat-template",
        lambda: ChatTemplateResolutionError("No chat template is defined"),
        400,
        "BadRequestError",
        "client",
        "No chat template is defined",
    ),
    Case(
        "bare-client",
        lambda: VLLMClientError("Prompt is too long"),
        400,
        "BadRequestError",
        "client",
        "Prompt is too long",
    ),
    Case(
        "generation",
        lambda: GenerationError("KV cache load failed"),
        500,
        "InternalServerError",
        "server",
        "KV cache load failed",
    ),
    Case(
        "retryable",
        lambda: RetryableRequestError(),
        503,
        "ServiceUnavailableError",
        "server",
        "Request failed; please retry",
    ),
    Case(
        "graceful-429",
        lambda: GracefulHTTPError("Slow down", HTTPStatus.TOO_MANY_REQUESTS),
        429,
        "Too Many Requests",
        "client",
        "Slow down",
    ),
    Case(
        "queue-overflow",
        QueueOverflowError,
        503,
        "Service Unavailable",
        "server",
        "The engine is currently busy and cannot accept new requests. "
        "Please try again later or on a different instance.",
    ),
    Case(
        "max-queued-tokens",
        MaxQueuedTokensError,
        503,
        "Service Unavailable",
        "server",
        "The engine has reached its prefill token backlog limit. "
        "Please try again later or on a different instance.",
    ),
    Case(
        "profiler-active",
        ProfilerAlreadyActiveError,
        409,
        "Conflict",
        "client",
        "A profiling session is already active. Call /stop_profile before "
        "starting another session.",
    ),
    Case(
        "engine-dead",
        EngineDeadError,
        500,
        "InternalServerError",
        "server",
        GENERIC,
        fatal=True,
    ),
    Case(
        "engine-generate",
        lambda: EngineGenerateError("generate() failed"),
        500,
        "InternalServerError",
        "server",
        "generate() failed",
    ),
    Case(
        "bare-server",
        lambda: VLLMServerError("Sampler state is inconsistent"),
        500,
        "InternalServerError",
        "server",
        "Sampler state is inconsistent",
    ),
    Case(
        "bare-vllm",
        lambda: VLLMError("neither client nor server"),
        500,
        "InternalServerError",
        "server",
        GENERIC,
    ),
]

OMNI_CASES: list[Case] = [
    Case(
        "guardrail",
        lambda: GuardrailViolationError(
            "Blocked by the content policy", parameter="messages.1.content"
        ),
        400,
        "GuardrailViolationError",
        "client",
        "Blocked by the content policy",
        parameter="messages.1.content",
    ),
    Case(
        "conflict",
        lambda: OmniConflictError("Job job-7 is still running"),
        409,
        "ConflictError",
        "client",
        "Job job-7 is still running",
    ),
    Case(
        "not-implemented",
        lambda: OmniNotImplementedError("Streaming is not implemented for video"),
        501,
        "NotImplementedError",
        "server",
        "Streaming is not implemented for video",
    ),
    Case(
        "unavailable",
        lambda: OmniServiceUnavailableError("No stage accepts audio input"),
        503,
        "ServiceUnavailableError",
        "server",
        "No stage accepts audio input",
    ),
    Case(
        "stage-timeout",
        lambda: OmniStageTimeoutError("Stage 2 timed out after 30 s", stage_id=2),
        504,
        "GatewayTimeoutError",
        "server",
        "Stage 2 timed out after 30 s",
        stage_id=2,
    ),
    Case(
        "omni-engine-generate",
        lambda: OmniEngineGenerateError("Vocoder failed", stage_id=1),
        500,
        "InternalServerError",
        "server",
        "Vocoder failed",
        stage_id=1,
    ),
    Case(
        "omni-engine-dead",
        lambda: OmniEngineDeadError(stage_id=3, reason="CUDA out of memory"),
        500,
        "InternalServerError",
        "server",
        GENERIC,
        fatal=True,
        stage_id=3,
    ),
    Case(
        "omni-client-404",
        lambda: OmniClientError(
            "Unknown voice", status_code=404, error_type="NotFoundError"
        ),
        404,
        "NotFoundError",
        "client",
        "Unknown voice",
    ),
    Case(
        "omni-client-413",
        lambda: OmniClientError(
            "Audio is too long", status_code=413, error_type="RequestTooLargeError"
        ),
        413,
        "RequestTooLargeError",
        "client",
        "Audio is too long",
    ),
    Case(
        "omni-server-502",
        lambda: OmniServerError(
            "Stage 1 is unreachable", status_code=502, error_type="BadGatewayError"
        ),
        502,
        "BadGatewayError",
        "server",
        "Stage 1 is unreachable",
    ),
]


def _expected(case: Case, **override: Any) -> OmniErrorDetails:
    fields: dict[str, Any] = {
        "message": case.message,
        "category": case.category,
        "status_code": case.status,
        "error_type": case.error_type,
        "parameter": case.parameter,
        "stage_id": case.stage_id,
        "fatal": case.fatal,
    }
    return OmniErrorDetails(**(fields | override))


@pytest.mark.parametrize("case", UPSTREAM_CASES + OMNI_CASES, ids=lambda c: c.id)
def test_status_table(case: Case) -> None:
    assert normalize(case.make()) == _expected(case)


@pytest.mark.parametrize("case", UPSTREAM_CASES + OMNI_CASES, ids=lambda c: c.id)
def test_ids_are_attached(case: Case) -> None:
    record = normalize(case.make(), request_id="chatcmpl-42", stage_id=0)
    # The exception's own stage is more specific than the caller's.
    stage = 0 if case.stage_id is None else case.stage_id
    assert record == _expected(case, request_id="chatcmpl-42", stage_id=stage)


# Where the design (docs/design.md §2) deliberately differs from upstream's
# message (status, type and param always agree): validation errors never show
# the rejected value, and a VLLMError that is neither client nor server shows
# the generic message. Before vLLM 0.33 (no ``EngineDeadError.CLIENT_MESSAGE``)
# upstream sent a dead engine's log text; the generic message stands in.
_OWN_MESSAGE_POLICY = {"validation", "unprocessable", "bare-vllm"} | (
    set() if hasattr(EngineDeadError, "CLIENT_MESSAGE") else {"engine-dead"}
)


@pytest.mark.parametrize("case", UPSTREAM_CASES, ids=lambda c: c.id)
def test_agrees_with_upstream_create_error_response(case: Case) -> None:
    ours = normalize(case.make())
    upstream = create_error_response(case.make()).error
    assert (ours.status_code, ours.error_type, ours.parameter) == (
        upstream.code,
        upstream.type,
        upstream.param,
    )
    if case.id not in _OWN_MESSAGE_POLICY:
        assert ours.message == upstream.message


def test_engine_dead_message_is_the_client_message_in_both() -> None:
    assert normalize(EngineDeadError()).message == ENGINE_DEAD_CLIENT_MESSAGE
    assert ENGINE_DEAD_CLIENT_MESSAGE == GENERIC
    upstream = create_error_response(EngineDeadError()).error.message
    if hasattr(EngineDeadError, "CLIENT_MESSAGE"):  # vLLM 0.33+
        assert EngineDeadError.CLIENT_MESSAGE is ENGINE_DEAD_CLIENT_MESSAGE
        assert upstream == GENERIC
    else:  # upstream sent its log text; ours never does
        assert upstream == str(EngineDeadError()) != GENERIC


# -- what never leaves ---------------------------------------------------------


def test_rejected_value_never_appears() -> None:
    exc = VLLMValidationError("bad", parameter="temperature", value="sk-live-123")
    assert "sk-live-123" in str(exc)  # upstream's str() carries it ...
    record = normalize(exc)
    assert record == OmniErrorDetails(
        "bad", "client", 400, "BadRequestError", parameter="temperature"
    )
    assert "sk-live-123" not in json.dumps(record.to_wire())
    assert "sk-live-123" not in json.dumps(record.to_wire(legacy=True))


def test_rejected_value_without_message_argument() -> None:
    exc = VLLMUnprocessableEntityError.__new__(VLLMUnprocessableEntityError)
    exc.parameter, exc.value = "image_url", "hf_secretsecret123"
    record = normalize(exc)
    assert "secret" not in repr(record)
    assert (record.status_code, record.parameter) == (422, "image_url")


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("invalid literal for int() with base 10: 'sk-abc123'"),
        KeyError("/home/alice/.cache/huggingface/token"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        ZeroDivisionError("division by zero"),
        OSError(2, "No such file or directory", "/etc/vllm/secret.yaml"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_unknown_exception_is_a_generic_500(exc: Exception) -> None:
    record = normalize(exc, request_id="req-1")
    assert record == OmniErrorDetails(
        GENERIC, "server", 500, "InternalServerError", request_id="req-1"
    )
    assert str(exc.args[-1]) not in json.dumps(record.to_wire())


# -- legacy mode ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            ValueError("n must be at most 128, got /tmp/x/y.json"),
            OmniErrorDetails(
                "n must be at most 128, got <path>", "client", 400, "BadRequestError"
            ),
        ),
        (
            TypeError("prompt must be a string"),
            OmniErrorDetails(
                "prompt must be a string", "client", 400, "BadRequestError"
            ),
        ),
        (
            OverflowError("int too large to convert"),
            OmniErrorDetails(
                "int too large to convert", "client", 400, "BadRequestError"
            ),
        ),
        (
            json.JSONDecodeError("Expecting value", "{", 1),
            OmniErrorDetails(
                "Expecting value: line 1 column 2 (char 1)",
                "client",
                400,
                "BadRequestError",
            ),
        ),
        (
            NotImplementedError("beam search"),
            OmniErrorDetails(GENERIC, "server", 501, "NotImplementedError"),
        ),
        (
            KeyError("model"),
            OmniErrorDetails(GENERIC, "server", 500, "InternalServerError"),
        ),
        (
            VLLMNotFoundError("no such model"),
            OmniErrorDetails("no such model", "client", 404, "NotFoundError"),
        ),
    ],
    ids=lambda v: type(v).__name__,
)
def test_legacy_mode_fallbacks(exc: BaseException, expected: OmniErrorDetails) -> None:
    assert normalize(exc, mode="legacy") == expected


@pytest.mark.parametrize(
    "exc_type", [ValueError, TypeError, OverflowError, NotImplementedError]
)
def test_strict_mode_has_no_fallbacks(exc_type: type[Exception]) -> None:
    assert normalize(exc_type("x")) == OmniErrorDetails(
        GENERIC, "server", 500, "InternalServerError"
    )
    assert is_legacy_fallback(exc_type("x")) is True


class _ServerValueError(ValueError, VLLMServerError):
    """A migrated type that still inherits ValueError for old callers."""


@pytest.mark.parametrize(
    "exc",
    [KeyError("x"), RuntimeError("x"), VLLMClientError("x"), _ServerValueError("x")],
    ids=lambda e: type(e).__name__,
)
def test_not_a_legacy_fallback(exc: BaseException) -> None:
    assert is_legacy_fallback(exc) is False


def test_semantic_type_beats_raw_fallback_in_legacy_mode() -> None:
    # Upstream checks VLLMServerError before ValueError; so do we, in both modes.
    expected = OmniErrorDetails("x", "server", 500, "InternalServerError")
    assert normalize(_ServerValueError("x"), mode="legacy") == expected
    assert normalize(_ServerValueError("x")) == expected
    assert create_error_response(_ServerValueError("x")).error.code == 500


# -- explicit records and ids ----------------------------------------------------


def test_own_details_are_used_verbatim() -> None:
    record = OmniErrorDetails("Stage 1 rejected the voice", "client", 422, "Voice")
    exc = RuntimeError("private text")
    exc.details = record  # type: ignore[attr-defined]
    assert normalize(exc) is record
    filled = normalize(exc, request_id="r-1", stage_id=4)
    assert filled == dataclasses.replace(record, request_id="r-1", stage_id=4)


def test_own_details_keep_their_ids() -> None:
    record = OmniErrorDetails(GENERIC, "server", 500, "X", request_id="a", stage_id=1)
    exc = OmniServerError(GENERIC, details=record)
    assert normalize(exc, request_id="b", stage_id=2) is record


@pytest.mark.parametrize(
    "request_id", ["has space", "", "x" * 200, "-leading-dash", "id\n", 7, None]
)
def test_unsafe_request_id_is_dropped(request_id: Any) -> None:
    assert normalize(VLLMClientError("x"), request_id=request_id).request_id is None


@pytest.mark.parametrize("stage_id", [-1, True, "1", 1.0, None])
def test_invalid_stage_id_is_dropped(stage_id: Any) -> None:
    assert normalize(VLLMClientError("x"), stage_id=stage_id).stage_id is None


def test_empty_client_message_uses_the_reason_phrase() -> None:
    assert normalize(VLLMNotFoundError()).message == "Not Found"
    assert normalize(OmniConflictError("  \x00 ")).message == "Conflict"


def test_garbage_declared_type_falls_back_to_the_status_type() -> None:
    exc = OmniClientError("x", status_code=404, error_type="Not\nFound <b>")
    assert normalize(exc) == OmniErrorDetails("x", "client", 404, "NotFoundError")
    odd = OmniClientError("x", status_code=418, error_type="Not\nFound <b>")
    assert normalize(odd) == OmniErrorDetails("x", "client", 418, "BadRequestError")


def test_out_of_range_declared_status_falls_back_to_the_default() -> None:
    gen = GenerationError("x")
    gen.status_code = 404  # a server type cannot become a client error
    assert normalize(gen).status_code == 500
    graceful = GracefulHTTPError("moved", HTTPStatus.FOUND)
    assert normalize(graceful) == OmniErrorDetails(
        "moved", "server", 500, "Internal Server Error"
    )


class _UnhashableMeta(type):
    """A metaclass that makes its classes unhashable (so no cached row lookup)."""

    def __eq__(cls, other: object) -> bool:
        return cls is other

    __hash__ = None  # type: ignore[assignment]


class _UnhashableType(Exception, metaclass=_UnhashableMeta):
    pass


@pytest.mark.parametrize(("stage_id", "kept"), [(2, 2), (True, None), (-1, None)])
def test_last_resort_record_is_valid(stage_id: Any, kept: int | None) -> None:
    # Classifying this type fails; the safety-net record must still be valid.
    record = normalize(_UnhashableType("private"), request_id="r", stage_id=stage_id)
    assert record == OmniErrorDetails(
        GENERIC, "server", 500, "InternalServerError", request_id="r", stage_id=kept
    )


# -- to_exception ------------------------------------------------------------------

TO_EXCEPTION_CASES: list[tuple[OmniErrorDetails, type[VLLMError]]] = [
    (
        OmniErrorDetails("bad", "client", 400, "BadRequestError", parameter="n"),
        RemoteVLLMValidationError,
    ),
    (
        OmniErrorDetails("gone", "client", 404, "NotFoundError", stage_id=1),
        RemoteVLLMNotFoundError,
    ),
    (OmniErrorDetails("slow", "client", 429, "RateLimitError"), OmniClientError),
    (OmniErrorDetails("odd", "client", 404, "Not Found"), OmniClientError),
    (
        OmniErrorDetails(GENERIC, "server", 500, "InternalServerError", fatal=True),
        OmniEngineDeadError,
    ),
    (
        OmniErrorDetails(
            GENERIC, "server", 500, "InternalServerError", stage_id=2, fatal=True
        ),
        OmniEngineDeadError,
    ),
    (
        OmniErrorDetails("vocoder", "server", 500, "InternalServerError", stage_id=2),
        OmniEngineGenerateError,
    ),
    (
        OmniErrorDetails("late", "server", 504, "GatewayTimeoutError", stage_id=2),
        RemoteOmniStageTimeoutError,
    ),
    (
        OmniErrorDetails("busy", "server", 503, "ServiceUnavailableError"),
        RemoteOmniServiceUnavailableError,
    ),
    (
        OmniErrorDetails("busy", "server", 503, "Service Unavailable"),
        OmniServerError,
    ),
    (OmniErrorDetails(GENERIC, "server", 500, "InternalServerError"), OmniServerError),
    (
        OmniErrorDetails("x", "server", 500, "InternalServerError", request_id="r-9"),
        OmniServerError,
    ),
]


@pytest.mark.parametrize(
    ("record", "exc_type"), TO_EXCEPTION_CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_to_exception(record: OmniErrorDetails, exc_type: type[VLLMError]) -> None:
    exc = to_exception(record)
    assert type(exc) is exc_type
    assert exc.details == record  # type: ignore[attr-defined]
    assert normalize(exc) == record
    assert isinstance(exc, VLLMClientError) is (record.category == "client")
    if exc_type in (OmniEngineDeadError, OmniEngineGenerateError):
        assert exc.stage_id == record.stage_id  # type: ignore[attr-defined]
    # The 0.30 wrappers keep catching what they caught, for one release.
    if record.category == "client":
        assert isinstance(exc, OmniClientError)
    elif not record.fatal and exc_type is not OmniEngineGenerateError:
        assert isinstance(exc, OmniServerError)


def test_a_client_record_with_503_cannot_exist() -> None:
    with pytest.raises(RuntimeError, match="client error needs a status"):
        OmniErrorDetails("busy", "client", 503, "ServiceUnavailableError")


# -- vllm.outputs.RequestError ----------------------------------------------------


# vLLM 0.32+; an older engine reports no per-request error (nothing to read).
RequestError: Any = getattr(vllm.outputs, "RequestError", None)
needs_request_error = pytest.mark.skipif(
    RequestError is None,
    reason=f"vLLM {vllm.__version__} has no vllm.outputs.RequestError "
    "(added in vLLM 0.32)",
)
# vLLM 0.33+: a RequestError names its exception (``to_exception``), and a
# ``validation_error`` code is the client's; 0.32's has neither.
needs_to_exception = pytest.mark.skipif(
    not hasattr(RequestError, "to_exception"),
    reason=f"vLLM {vllm.__version__} has no RequestError.to_exception "
    "(added in vLLM 0.33)",
)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(
            lambda: RequestError(code="validation_error", message="prompt is too long"),
            OmniErrorDetails(
                "prompt is too long", "client", 400, "BadRequestError", request_id="r"
            ),
            id="validation",
            marks=[needs_request_error, needs_to_exception],
        ),
        pytest.param(
            lambda: RequestError(
                code="kv_load_failed", message="try again", retryable=True
            ),
            OmniErrorDetails(
                "try again", "server", 503, "ServiceUnavailableError", request_id="r"
            ),
            id="retryable",
            marks=needs_request_error,
        ),
        pytest.param(
            lambda: RequestError(code="kv_load_failed", message="KV load failed"),
            OmniErrorDetails(
                "KV load failed", "server", 500, "InternalServerError", request_id="r"
            ),
            id="other",
            marks=needs_request_error,
        ),
        pytest.param(
            object,
            OmniErrorDetails(
                GENERIC, "server", 500, "InternalServerError", request_id="r"
            ),
            id="malformed",
        ),
    ],
)
def test_from_request_error(
    make: Callable[[], Any], expected: OmniErrorDetails
) -> None:
    assert from_request_error(make(), request_id="r") == expected


@needs_request_error
def test_from_request_error_keeps_the_stage() -> None:
    error = RequestError(code="internal", message="boom")
    assert from_request_error(error, stage_id=2).stage_id == 2


# -- the invariant: normalize never raises, every record is valid ------------------


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class _StrReturnsBytes(VLLMClientError):
    def __str__(self) -> Any:
        return b"bytes"


class _HostileAttributes(VLLMClientError):
    """Every attribute the normalizer might read raises."""

    def __getattribute__(self, name: str) -> Any:
        if name in {"__class__", "__dict__"}:
            return object.__getattribute__(self, name)
        raise RuntimeError(name)


class _PropertyRaises(VLLMValidationError):
    @property
    def details(self) -> Any:
        raise ValueError("details")

    @property
    def stage_id(self) -> Any:
        raise KeyError("stage")

    @property
    def message(self) -> Any:
        raise TypeError("message")


class _BothSides(VLLMClientError, VLLMServerError):
    """Inherits both owners; the first in the MRO decides."""


class _WeirdGraceful(GracefulHTTPError):
    pass


EXCEPTION_TYPES: list[type[BaseException]] = [
    # builtins
    BaseException,
    Exception,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    RuntimeError,
    OSError,
    OverflowError,
    NotImplementedError,
    ZeroDivisionError,
    RecursionError,
    UnicodeDecodeError,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
    # every table class and upstream subclass
    VLLMError,
    VLLMClientError,
    VLLMServerError,
    VLLMValidationError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    LoRAAdapterNotFoundError,
    *(
        cls
        for name in (
            "ChatTemplateResolutionError",
            "RetryableRequestError",
            "ProfilerAlreadyActiveError",
        )
        if (cls := newer(name)) is not None
    ),
    GenerationError,
    GracefulHTTPError,
    QueueOverflowError,
    MaxQueuedTokensError,
    EngineGenerateError,
    EngineDeadError,
    GuardrailViolationError,
    OmniConflictError,
    OmniNotImplementedError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    OmniEngineGenerateError,
    OmniEngineDeadError,
    OmniClientError,
    OmniServerError,
    # hostile
    _StrRaises,
    _StrReturnsBytes,
    _HostileAttributes,
    _PropertyRaises,
    _BothSides,
    _WeirdGraceful,
]

# Attributes that any row or the normalizer might read.
ATTRIBUTES = [
    "details",
    "stage_id",
    "parameter",
    "value",
    "message",
    "status_code",
    "http_status",
    "error_type",
    "CLIENT_MESSAGE",
    "reason",
]

SECRETISH = st.sampled_from(
    [
        "sk-live-0123456789",
        "hf_abcdefghijkl",
        "AKIAIOSFODNN7EXAMPLE",
        "password=hunter2",
        'File "/usr/lib/python3.11/x.py", line 3, in f',
        'Traceback (most recent call last):\n  File "/x.py", line 1\n',
        "/home/alice/.ssh/id_rsa",
        "C:\\Users\\bob\\key.pem",
        "<obj at 0x7f3a2b1c4d50>",
        "data:image/png;base64," + "QUJD" * 30,
        "https://user:pass@example.com",
        "\x00\x1b[31m\u202e",
        "x" * 20_000,
    ]
)
TEXT = st.one_of(
    st.text(max_size=200),
    SECRETISH,
    st.lists(st.one_of(SECRETISH, st.text(max_size=8)), max_size=6).map(" ".join),
)
GARBAGE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True),
        TEXT,
        st.binary(max_size=64),
        st.just(HTTPStatus.SERVICE_UNAVAILABLE),
        st.just(b"\xff" * 10_000),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=6,
)


def _valid_details() -> st.SearchStrategy[OmniErrorDetails]:
    return st.builds(
        OmniErrorDetails,
        message=TEXT.map(sanitize_message).filter(bool),
        category=st.just("server"),
        status_code=st.integers(500, 599),
        error_type=st.just("InternalServerError"),
        stage_id=st.none() | st.integers(0, 7),
        fatal=st.booleans(),
    )


ATTRIBUTE_VALUE = st.one_of(
    GARBAGE,
    _valid_details(),
    st.integers(-10, 1000),
    st.sampled_from(["temperature", "messages.0", "bad param", "", "9x"]),
)


@st.composite
def exceptions(draw: st.DrawFn, depth: int = 2) -> BaseException:
    exc_type = draw(st.sampled_from(EXCEPTION_TYPES))
    args = draw(st.lists(GARBAGE, max_size=3))
    # Skip __init__: it is the attributes, not the constructor, that vary.
    exc = exc_type.__new__(exc_type, *args)
    if not isinstance(exc, _HostileAttributes):
        for name in draw(
            st.lists(st.sampled_from(ATTRIBUTES), unique=True, max_size=4)
        ):
            if not isinstance(exc, _PropertyRaises) or name not in {
                "details",
                "stage_id",
                "message",
            }:
                setattr(exc, name, draw(ATTRIBUTE_VALUE))
    if depth and draw(st.booleans()):
        exc.__cause__ = draw(exceptions(depth - 1))
    if depth and draw(st.booleans()):
        exc.__context__ = draw(exceptions(depth - 1))
    return exc


def assert_valid(record: OmniErrorDetails) -> None:
    assert type(record) is OmniErrorDetails
    low = {"client": 400, "server": 500}[record.category]
    assert type(record.status_code) is int
    assert low <= record.status_code < low + 100
    assert record.fatal is False or (
        record.fatal is True and record.category == "server"
    )
    assert isinstance(record.message, str)
    assert record.message == sanitize_message(record.message)
    assert len(record.message) <= 1024
    assert record.parameter is None or PARAMETER_RE.match(record.parameter)
    stage_id = record.stage_id
    assert stage_id is None or (
        isinstance(stage_id, int) and not isinstance(stage_id, bool) and stage_id >= 0
    )
    wire = record.to_wire()
    assert OmniErrorDetails.from_wire(json.loads(json.dumps(wire))) == record
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(wire)) == wire


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    exc=exceptions(),
    request_id=st.one_of(st.none(), st.text(max_size=10), GARBAGE),
    stage_id=st.one_of(st.none(), st.integers(-3, 10), GARBAGE),
    mode=st.sampled_from(["strict", "legacy"]),
)
def test_normalize_never_raises_and_records_are_valid(
    exc: BaseException, request_id: Any, stage_id: Any, mode: Any
) -> None:
    record = normalize(exc, request_id=request_id, stage_id=stage_id, mode=mode)
    assert_valid(record)
    own = exc.__dict__.get("details")
    if isinstance(own, OmniErrorDetails):
        assert (record.category, record.status_code, record.message) == (
            own.category,
            own.status_code,
            own.message,
        )
    elif not isinstance(exc, VLLMError) and not (
        mode == "legacy" and is_legacy_fallback(exc)
    ):
        assert record.message == GENERIC
        assert record.status_code == 500


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=st.builds(lambda e: normalize(e), exceptions(depth=0)))
def test_to_exception_round_trips(record: OmniErrorDetails) -> None:
    exc = to_exception(record)
    assert exc.details == record  # type: ignore[attr-defined]
    assert normalize(exc, request_id="other", stage_id=9) == dataclasses.replace(
        record,
        request_id=record.request_id or "other",
        stage_id=9 if record.stage_id is None else record.stage_id,
    )
    assert normalize(exc) == record
    remote = REMOTE_TYPES.get((record.category, record.status_code, record.error_type))
    if record.fatal:
        assert type(exc) is OmniEngineDeadError
    elif remote is not None:
        assert type(exc) is remote
    elif record.category == "client":
        assert type(exc) is OmniClientError
    elif record.stage_id is not None and record.error_type == "InternalServerError":
        assert type(exc) is OmniEngineGenerateError
    else:
        assert type(exc) is OmniServerError


def test_unhashable_exception_class_is_an_unknown_server_error() -> None:
    class Unhashable(type):
        __hash__ = None  # type: ignore[assignment]

    class Odd(Exception, metaclass=Unhashable):
        pass

    from vllm_omni.errors.normalizer import is_legacy_fallback
    from vllm_omni.errors.table import row_for

    assert row_for(Odd, True).exc_type is BaseException
    assert is_legacy_fallback(Odd("x")) is False
    details = normalize(Odd("/home/alice"), mode="legacy")
    assert (details.status_code, details.error_type) == (500, "InternalServerError")
    assert details.message == "The server had an error while processing your request."


@pytest.mark.skipif(
    newer("ChatTemplateResolutionError") is not None,
    reason="vLLM 0.33+ defines it in vllm.exceptions: the chat-template case",
)
def test_chat_template_error_before_0_33_is_a_raw_value_error() -> None:
    """Before vLLM 0.33 it is a ``ValueError`` of ``vllm.entrypoints.chat_utils``
    (0.32: ``vllm.renderers.chat_utils``; docs/errors/status-mapping.md, "Older
    vLLM releases"): unknown in strict mode, upstream's 400 in legacy mode."""
    module = next(
        name
        for name in ("vllm.renderers.chat_utils", "vllm.entrypoints.chat_utils")
        if importlib.util.find_spec(name) is not None
    )
    older = importlib.import_module(module).ChatTemplateResolutionError
    exc = older("No chat template is defined")
    assert isinstance(exc, ValueError) and not isinstance(exc, VLLMError)
    assert normalize(exc) == OmniErrorDetails(
        GENERIC, "server", 500, "InternalServerError"
    )
    legacy = normalize(exc, mode="legacy")
    upstream = create_error_response(exc).error
    assert (legacy.status_code, legacy.error_type, legacy.message) == (
        upstream.code,
        upstream.type,
        upstream.message,
    )
    assert legacy.status_code == 400 and legacy.error_type == "BadRequestError"


@pytest.mark.skipif(
    RequestError is None or hasattr(RequestError, "to_exception"),
    reason="vLLM 0.32's RequestError only (no to_exception); installed: "
    f"vLLM {vllm.__version__}",
)
def test_a_0_32_request_error_is_read_as_its_servers_read_it() -> None:
    """0.32's servers raise ``RetryableRequestError`` for a retryable
    ``RequestError``, else ``GenerationError``, whatever its code."""
    error = RequestError(code="validation_error", message="too long")
    assert from_request_error(error) == OmniErrorDetails(
        "too long", "server", 500, "InternalServerError"
    )
    retry = RequestError(code="multimodal_cache_miss", message="miss", retryable=True)
    assert from_request_error(retry, stage_id=3) == OmniErrorDetails(
        "miss", "server", 503, "ServiceUnavailableError", stage_id=3
    )
