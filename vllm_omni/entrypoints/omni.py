"""``Omni``: the offline (synchronous) Python API over ``AsyncOmni``.

Owns a private event loop running in a daemon thread, on which one
``AsyncOmni`` lives; every call is submitted to that loop and waited for.
Errors arrive as exceptions (docs/design.md §4, offline Python), like responses
arrive over HTTP: the most specific semantic exception, whether it was raised
in this process (``VLLMValidationError`` for bad prompts or modalities,
``OmniServiceUnavailableError`` after ``close``, ...) or in a stage (rebuilt
from its record); every one carries ``.details`` with its request id and
survives ``pickle``. With ``raise_on_error=False`` a failed prompt instead
returns an output whose ``details`` is the error record.

A call never leaves work behind: ``generate(timeout=…)`` raises
``OmniStageTimeoutError`` (504) when the prompts are not done in time, and on
that, on ``KeyboardInterrupt`` (Ctrl-C) or on any other exception while it
waits, every request of the call is aborted in every stage before the
exception propagates. An ``Omni`` dropped without ``close()`` is stopped by a
finalizer (stages and loop thread gone within about two seconds).

Usage (a plain top-level script, ``python - < script.py`` or a notebook:
stage processes never re-run the caller's main module)::

    with Omni(pipeline="reference") as omni:
        print(omni.generate("Hello", modalities=["text"]).text)

Stage logs follow the caller's ``logging`` configuration of the
``vllm_omni`` logger; with none, only warnings (without tracebacks) appear.

This module must not classify errors or render them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from vllm_omni.config import PipelineConfig
from vllm_omni.entrypoints.async_omni import AsyncOmni, parse_modalities
from vllm_omni.errors import (
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMValidationError,
    normalize,
    raise_for_caller,
)
from vllm_omni.errors.metrics import AbortReason
from vllm_omni.outputs import DiffusionOutput, OmniRequestOutput

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

__all__ = ["Omni"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

# How long a failed or interrupted call waits for its aborts to be posted.
_ABORT_WAIT_S = 2.0
_SHUTDOWN_WAIT_S = 10.0


class Omni:
    """A started engine for offline use; close it (or use ``with``) when done.

    Accepts the same arguments as ``AsyncOmni``.
    """

    def __init__(
        self,
        pipeline: str | os.PathLike[str] | PipelineConfig = "reference",
        **engine_kwargs: Any,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="omni-engine-loop", daemon=True
        )
        self._thread.start()
        self._closed = False
        # Does not reference self: it runs when this object is collected.
        engine_ref = _EngineRef()
        self._finalizer = weakref.finalize(
            self, _stop, self._loop, self._thread, engine_ref
        )
        try:
            self.engine: AsyncOmni = self._call(
                AsyncOmni.create(pipeline, **engine_kwargs)
            )
        except Exception as exc:
            self._finalizer()
            raise_for_caller(exc)
        except BaseException:
            self._finalizer()
            raise
        engine_ref.engine = self.engine

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise_for_caller(OmniServiceUnavailableError("The engine is closed."))

    @overload
    def generate(  # type: ignore[overload-overlap]  # a str is a Sequence[str]
        self,
        prompts: str,
        *,
        modalities: Iterable[str] | str = ...,
        params: Mapping[str, Any] | SamplingParams | None = ...,
        raise_on_error: bool = ...,
        timeout: float | None = ...,
    ) -> OmniRequestOutput: ...

    @overload
    def generate(
        self,
        prompts: Sequence[str],
        *,
        modalities: Iterable[str] | str = ...,
        params: Mapping[str, Any] | SamplingParams | None = ...,
        raise_on_error: bool = ...,
        timeout: float | None = ...,
    ) -> list[OmniRequestOutput]: ...

    def generate(
        self,
        prompts: str | Sequence[str],
        *,
        modalities: Iterable[str] | str = ("text",),
        params: Mapping[str, Any] | SamplingParams | None = None,
        raise_on_error: bool = True,
        timeout: float | None = None,
    ) -> OmniRequestOutput | list[OmniRequestOutput]:
        """Run prompts to completion; the final output of each (list in, list out).

        A list runs concurrently. With ``raise_on_error`` (default) the first
        failure in prompt order is raised; otherwise failed prompts return an
        output with ``details`` set and ``finished=True``. Prompts that are
        not a string or a list of strings raise ``VLLMValidationError``
        (``prompts`` / ``prompts[i]``) before anything runs; a call after
        ``close`` raises ``OmniServiceUnavailableError``. ``timeout`` (seconds,
        for the whole call) raises ``OmniStageTimeoutError`` (504). Whatever
        ends the wait early (timeout, Ctrl-C, any exception) aborts every
        request of the call in every stage first.
        """
        self._check_open()
        single = isinstance(prompts, str)
        try:
            batch = [prompts] if single else _prompt_list(prompts)
            wanted = parse_modalities(modalities)
        except VLLMValidationError as exc:
            raise_for_caller(exc)
        request_ids = [f"omni-{uuid.uuid4().hex}" for _ in batch]
        future = asyncio.run_coroutine_threadsafe(
            self._run_all(batch, request_ids, wanted, params, raise_on_error),
            self._loop,
        )
        try:
            outputs = future.result(timeout)
        except concurrent.futures.TimeoutError:
            self._abort(future, request_ids, "abort")
            raise_for_caller(
                OmniStageTimeoutError(
                    f"The request did not finish within {timeout:g} s."
                )
            )
        except BaseException:
            # Ctrl-C lands here while this thread waits; the work is on the
            # loop thread and would run on in every stage without the abort.
            self._abort(future, request_ids, "cancelled")
            raise
        return outputs[0] if single else outputs

    def _abort(
        self,
        future: concurrent.futures.Future[Any],
        request_ids: list[str],
        reason: AbortReason,
    ) -> None:
        if future.done():
            return
        try:
            self._call(self.engine.abort(request_ids, reason=reason), _ABORT_WAIT_S)
        except BaseException:  # a second Ctrl-C: still cancel, then give up
            logger.warning("could not abort %d request(s) in time", len(request_ids))
        future.cancel()

    async def _run_all(
        self,
        prompts: list[Any],
        request_ids: list[str],
        modalities: tuple[str, ...],
        params: Mapping[str, Any] | SamplingParams | None,
        raise_on_error: bool,
    ) -> list[OmniRequestOutput]:
        results = await asyncio.gather(
            *(
                self._run_one(prompt, request_id, modalities, params)
                for prompt, request_id in zip(prompts, request_ids, strict=True)
            ),
            return_exceptions=True,
        )
        outputs: list[OmniRequestOutput] = []
        for request_id, result in zip(request_ids, results, strict=True):
            if isinstance(result, BaseException):
                if raise_on_error or not isinstance(result, Exception):
                    raise result
                outputs.append(_failed_output(result, request_id, modalities))
            else:
                outputs.append(result)
        return outputs

    async def _run_one(
        self,
        prompt: str,
        request_id: str,
        modalities: tuple[str, ...],
        params: Mapping[str, Any] | SamplingParams | None,
    ) -> OmniRequestOutput:
        final: OmniRequestOutput | None = None
        async for output in self.engine.generate(
            prompt, request_id=request_id, modalities=modalities, params=params
        ):
            final = output
        assert final is not None and final.finished
        return final

    def close(self) -> None:
        """Shut the engine down and stop the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _prompt_list(prompts: object) -> list[str]:
    """A batch of prompts, or ``VLLMValidationError`` naming the bad one."""
    if isinstance(prompts, Mapping | bytes | bytearray) or not isinstance(
        prompts, Iterable
    ):
        raise VLLMValidationError(
            "prompts must be a string or a list of strings", parameter="prompts"
        )
    batch = list(prompts)
    for index, prompt in enumerate(batch):
        if not isinstance(prompt, str):
            raise VLLMValidationError(
                "each prompt must be a string", parameter=f"prompts[{index}]"
            )
    return batch


class _EngineRef:
    """The finalizer's handle on the engine, filled in once it started."""

    engine: AsyncOmni | None = None


async def _shutdown(engine: AsyncOmni) -> None:
    engine.shutdown()


def _stop(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, ref: _EngineRef
) -> None:
    """Shut the engine down on its loop, then stop the loop and its thread
    (``close()`` and the finalizer of a dropped ``Omni``)."""
    if ref.engine is not None and thread.is_alive():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shutdown(ref.engine), loop).result(
                _SHUTDOWN_WAIT_S
            )
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_SHUTDOWN_WAIT_S)
    if not thread.is_alive():
        loop.close()


def _failed_output(
    error: Exception, request_id: str, modalities: tuple[str, ...]
) -> OmniRequestOutput:
    details = normalize(error, request_id=request_id)
    diffusion = None
    if {"image", "video"} & set(modalities):
        diffusion = DiffusionOutput(details=details)
    return OmniRequestOutput(
        request_id=request_id,
        finished=True,
        finish_reason="error",
        diffusion=diffusion,
        details=details,
    )
