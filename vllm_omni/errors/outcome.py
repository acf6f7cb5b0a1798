"""The record a request ended with, for observers above the error layer.

Owns one context variable: an observer of a request (the tracing middleware,
a job's run) attaches an ``Outcome`` to the request's task before it runs,
and every error rendered for that request, on any transport, is noted on it
(``metrics.record_error`` calls ``note``). Tasks the request starts share
the same ``Outcome``. Without an observer nothing is kept. It must not look
at exceptions: it holds records that ``normalize`` already built.
"""

from __future__ import annotations

import contextvars
import dataclasses

from vllm_omni.errors.details import OmniErrorDetails

__all__ = ["Outcome", "note", "observe"]


@dataclasses.dataclass(slots=True)
class Outcome:
    """The last error rendered for one request (``None``: none so far)."""

    details: OmniErrorDetails | None = None


_OUTCOME: contextvars.ContextVar[Outcome | None] = contextvars.ContextVar(
    "vllm_omni_outcome", default=None
)


def observe() -> Outcome:
    """A new ``Outcome`` for the current task's request (and the tasks it
    starts from now on)."""
    outcome = Outcome()
    _OUTCOME.set(outcome)
    return outcome


def note(details: OmniErrorDetails) -> None:
    """``details`` were rendered for the current request: its observer, if
    it has one, keeps them."""
    outcome = _OUTCOME.get()
    if outcome is not None:
        outcome.details = details
