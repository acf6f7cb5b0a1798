"""``OmniErrorDetails``: the one serializable error record (docs/design.md §3).

Owns the record, its invariants and its wire form. A record is what crosses
stage and process boundaries and what every renderer reads; it holds only
public, sanitized text and bounded identifiers, never exception objects,
tracebacks, media or rejected values. This module does not look at
exceptions (that is ``normalize``) and does not build envelopes (that is
``render``). It imports nothing heavy, so stage processes and the audit can
use it cheaply.

An invariant violation is a bug in the code that built the record, so it
raises ``RuntimeError`` (a server error), never a ``ValueError`` that a legacy
fallback could turn into a 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from vllm_omni.errors.sanitize import (
    sanitize_message,
    sanitize_parameter,
    sanitize_request_id,
)

__all__ = [
    "DEFAULT_STATUS",
    "DEFAULT_TYPE",
    "HTTP_STATUS_TYPES",
    "LEGACY_WIRE_FIELDS",
    "STATUS_RANGES",
    "WIRE_FIELDS",
    "OmniErrorDetails",
    "default_type",
    "status_phrase",
]

GENERIC_SERVER_MESSAGE = "The server had an error while processing your request."
# Each owner's statuses and defaults: the one definition every module reads
# (here, not in table.py, because this module must stay cheap to import).
STATUS_RANGES: dict[str, range] = {"client": range(400, 500), "server": range(500, 600)}
DEFAULT_STATUS: dict[str, int] = {"client": 400, "server": 500}
DEFAULT_TYPE: dict[str, str] = {
    "client": "BadRequestError",
    "server": "InternalServerError",
}
# The public type of a status when nothing more specific is known (a record
# without a type, the web framework's own errors, an explicit compat status);
# names follow the OpenAI SDK's exception classes.
HTTP_STATUS_TYPES: dict[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
_ERROR_TYPE_RE = re.compile(r"[A-Za-z][A-Za-z0-9 _.-]{0,63}")

# The complete field set, and the flat fields that 0.30-era receivers read.
WIRE_FIELDS = (
    "message",
    "category",
    "status_code",
    "error_type",
    "parameter",
    "request_id",
    "stage_id",
    "fatal",
    "faulted",
    "retry_after_s",
)
LEGACY_WIRE_FIELDS = (
    "error",
    "status_code",
    "error_type",
    "fatal",
    "request_id",
    "stage_id",
)


# Stage ids index a pipeline's stages; the bound keeps them encodable by every
# wire format (msgpack's int range) and out of absurd label territory.
MAX_STAGE_ID = 2**31 - 1
# The longest retry delay a record may ask for (an hour): a recovery window
# longer than that is not a retry, it is an outage.
MAX_RETRY_AFTER_S = 3600


def is_stage_id(value: object) -> bool:
    """True for a plausible stage id: an int (not bool) in 0..2**31-1."""
    return type(value) is int and 0 <= value <= MAX_STAGE_ID


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_type(status: int, category: str | None = None) -> str:
    """The public type of ``status`` when a record or exception names none."""
    if category is None:
        category = "client" if status in STATUS_RANGES["client"] else "server"
    return HTTP_STATUS_TYPES.get(status, DEFAULT_TYPE[category])


def status_phrase(status: int) -> str:
    """The HTTP reason phrase of ``status``: the message of a record that has none."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Client Error" if status in STATUS_RANGES["client"] else "Server Error"


@dataclass(frozen=True, slots=True)
class OmniErrorDetails:
    """A sanitized, owner-tagged error record that survives any boundary."""

    message: str
    category: Literal["client", "server"]
    status_code: int
    error_type: str
    parameter: str | None = None
    request_id: str | None = None
    stage_id: int | None = None
    fatal: bool = False
    # A faulted engine refused the request while it recovers (vLLM 0.34's
    # EngineFaultedError): a server 503 that Python callers get back as that
    # class, after any boundary (docs/design.md §3).
    faulted: bool = False
    # Seconds a client should wait before retrying (``Retry-After``); None:
    # the default. Only a retryable record carries one.
    retry_after_s: int | None = None

    def __post_init__(self) -> None:
        problem = self._violation()
        if problem is not None:
            raise RuntimeError(f"invalid OmniErrorDetails: {problem}")

    def _violation(self) -> str | None:
        status_range = STATUS_RANGES.get(self.category)  # type: ignore[arg-type]
        if status_range is None:
            return f"category must be 'client' or 'server', got {self.category!r}"
        if not _is_int(self.status_code) or self.status_code not in status_range:
            return f"a {self.category} error needs a status in {status_range}"
        if not isinstance(self.fatal, bool) or (
            self.fatal and self.category != "server"
        ):
            return "fatal must be a bool and only a server error can be fatal"
        if not isinstance(self.error_type, str) or not _ERROR_TYPE_RE.fullmatch(
            self.error_type
        ):
            return "error_type must be a short identifier"
        if not isinstance(self.message, str) or sanitize_message(self.message) != (
            self.message
        ):
            return "message must be sanitized text"
        if not self.message.strip():
            return "message must not be empty (use the status phrase)"
        if self.parameter is not None and sanitize_parameter(self.parameter) is None:
            return "parameter must be a plain field path"
        if self.request_id is not None and sanitize_request_id(self.request_id) is None:
            return "request_id must be a short token"
        if self.stage_id is not None and not is_stage_id(self.stage_id):
            return "stage_id must be an int from 0 to 2147483647"
        if not isinstance(self.faulted, bool) or (
            self.faulted and (self.fatal or self.status_code != 503)
        ):
            return "faulted must be a bool and only a nonfatal server 503 is faulted"
        if self.retry_after_s is not None and not (
            _is_int(self.retry_after_s) and 1 <= self.retry_after_s <= MAX_RETRY_AFTER_S
        ):
            return f"retry_after_s must be an int from 1 to {MAX_RETRY_AFTER_S}"
        return None

    @property
    def is_client(self) -> bool:
        return self.category == "client"

    # -- wire form -------------------------------------------------------------

    def to_wire(self, *, legacy: bool = False) -> dict[str, Any]:
        """A plain dict: the complete field set plus the legacy flat fields.

        ``legacy=True`` gives only the legacy fields, for a strict 0.30-era
        receiver that rejects fields it does not know.
        """
        legacy_fields = {
            "error": self.message,
            "status_code": self.status_code,
            "error_type": self.error_type,
            "fatal": self.fatal,
            "request_id": self.request_id,
            "stage_id": self.stage_id,
        }
        if legacy:
            return legacy_fields
        return {
            "message": self.message,
            "category": self.category,
            "parameter": self.parameter,
            "faulted": self.faulted,
            "retry_after_s": self.retry_after_s,
            **legacy_fields,
        }

    @classmethod
    def from_wire(cls, data: object) -> OmniErrorDetails:
        """Read a record tolerantly; never raises.

        Unknown keys are ignored. A legacy record without ``category`` is read
        by its status: the one documented place where a status range decides
        ownership, because a 0.30 sender did not say. A record without a
        status (how 0.30 wrote a stage's own failure or death) and anything
        malformed become a safe server-500 record, with the generic message
        (nobody classified the text as public), that keeps the ids it could
        read and ``fatal``: a fatal record is never read as a nonfatal one.
        """
        if not isinstance(data, dict):
            return cls(GENERIC_SERVER_MESSAGE, "server", 500, "InternalServerError")
        request_id: str | None = None
        stage_id: int | None = None
        fatal = False
        try:
            # Inside the try: even a key lookup can raise (a key whose __eq__
            # raises and whose hash collides with one of ours).
            request_id = sanitize_request_id(data.get("request_id"))
            stage = data.get("stage_id")
            stage_id = stage if is_stage_id(stage) else None
            fatal = data.get("fatal") is True
            return _read_wire(data, request_id, stage_id)
        except Exception:
            return cls(
                GENERIC_SERVER_MESSAGE,
                "server",
                500,
                "InternalServerError",
                request_id=request_id,
                stage_id=stage_id,
                fatal=fatal,
            )


def _read_wire(
    data: dict[Any, Any], request_id: str | None, stage_id: int | None
) -> OmniErrorDetails:
    status = data.get("status_code")
    if not _is_int(status):
        raise RuntimeError("no status_code: the safe server record")
    category = data.get("category")
    legacy = category is None
    if legacy:
        category = next(name for name, span in STATUS_RANGES.items() if status in span)
    # ``message`` is the 0.31 name, ``error`` the 0.30 one: a record may carry
    # either (a compact 0.31 record has no ``error``), or both.
    message = data.get("message")
    if not isinstance(message, str):
        message = data.get("error")
    if message is not None and not isinstance(message, str):
        raise RuntimeError("message is not text")
    error_type = data.get("error_type")
    if not (isinstance(error_type, str) and _ERROR_TYPE_RE.fullmatch(error_type)):
        error_type = default_type(status, category)
    fatal = data.get("fatal", False)
    # Newer fields, read only when well formed: a peer that does not know
    # them never sends them, and a bad one must not cost the record.
    faulted = data.get("faulted") is True and status == 503 and fatal is not True
    retry_after = data.get("retry_after_s")
    if not (_is_int(retry_after) and 1 <= retry_after <= MAX_RETRY_AFTER_S):
        retry_after = None
    if fatal is True and legacy:
        # A 0.30 sender's fatal text is the log text of the death (receivers
        # keep it as ``reason``); what a client sees of it is generic.
        message = GENERIC_SERVER_MESSAGE
    return OmniErrorDetails(
        message=sanitize_message(message or "").strip() or status_phrase(status),
        category=category,
        status_code=status,
        error_type=error_type,
        parameter=sanitize_parameter(data.get("parameter")),
        request_id=request_id,
        stage_id=stage_id,
        fatal=fatal,  # type: ignore[arg-type]
        faulted=faulted and category == "server",
        retry_after_s=retry_after,
    )
