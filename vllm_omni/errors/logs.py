"""Credentials never reach a log line (docs/design.md §10, CWE-532).

Operators ship logs to aggregators that many people read. Tracebacks, paths
and request ids are what logs are for and stay; credentials go, by the same
rules that clean public messages (``sanitize.redact_credentials``), and so
does text that is not Unicode (a lone surrogate would make a strict UTF-8
handler raise).

``install_log_redaction`` sets the process's log-record factory, so every
record is redacted whoever logs it (ours, vLLM's, uvicorn's, Ray's) and
whichever handler and formatter write it: the message (``getMessage``),
string arguments (uvicorn's access formatter reads ``args`` directly), the
stack and the exception text a formatter renders (the traceback's exception
lines included). ``vllm-omni serve``, every stage process and every Ray stage
actor install it at startup; a program that runs the engine in its own
process may install it too. This module must not change what a record says
beyond that: levels, names and formats are the handlers' business.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_omni.errors.sanitize import may_hold_credentials, redact_credentials

__all__ = ["install_log_redaction"]

_MARK = "_vllm_omni_redacting"


class _Redacting(logging.LogRecord):
    """A log record whose text is redacted when it is rendered."""

    _exc_text: str | None

    def getMessage(self) -> str:
        return redact_credentials(super().getMessage())

    # Formatters cache the rendered traceback here (``Formatter.format``);
    # every one of them sets it through this property, so the cached text
    # is the redacted one.
    @property
    def exc_text(self) -> str | None:  # type: ignore[override]
        return self._exc_text

    @exc_text.setter
    def exc_text(self, text: str | None) -> None:
        self._exc_text = None if text is None else redact_credentials(text)


@functools.cache
def _redacting(cls: type[logging.LogRecord]) -> type[logging.LogRecord]:
    if issubclass(cls, _Redacting):
        return cls
    if cls is logging.LogRecord:
        return _Redacting
    # Someone else's record class: keep its behaviour, add ours on top.
    return type(f"Redacting{cls.__name__}", (_Redacting, cls), {})


def _redact_args(msg: object, args: Any) -> Any:
    """The record's string arguments redacted. Most lines hold no
    credential: when the line they make holds none and each of them appears
    in it as it is, none does either (``may_hold_credentials``), and the
    line is scanned once (the handler's redaction of it is then a lookup)."""
    if not isinstance(args, tuple):
        return args
    strings = [a for a in args if isinstance(a, str)]
    if not strings:
        return args
    if isinstance(msg, str):
        try:
            line = msg % args
        except Exception:  # logging reports it when a handler formats it
            line = None
        if (
            line is not None
            and all(a in line for a in strings)
            and not may_hold_credentials(line)
        ):
            return args
    return tuple(redact_credentials(a) if isinstance(a, str) else a for a in args)


def install_log_redaction() -> None:
    """Redact every log record this process creates from now on. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, _MARK, False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        exc_text = record.__dict__.pop("exc_text", None)
        record.__class__ = _redacting(type(record))
        record.exc_text = exc_text
        record.args = _redact_args(record.msg, record.args)
        if record.stack_info:
            record.stack_info = redact_credentials(record.stack_info)
        return record

    setattr(factory, _MARK, True)
    logging.setLogRecordFactory(factory)
