"""``Omni``: the offline (synchronous) Python API over ``AsyncOmni``.

Runs one ``AsyncOmni`` on a private event loop in a daemon thread and leaves
no call's work behind (docs/runtime.md §14, docs/errors/python.md). It must
not classify errors or render them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from tqdm import tqdm

from vllm_omni.config import PipelineConfig
from vllm_omni.entrypoints.async_omni import AsyncOmni, parse_modalities
from vllm_omni.entrypoints.sampling_params_list import per_stage_params
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

    Accepts the same arguments as ``AsyncOmni`` (``Omni(model=...,
    **engine_args)`` or ``Omni(pipeline=...)``); wrong ones raise the
    caller's error (``TypeError``, or ``VLLMValidationError`` naming the
    argument) before any engine starts.
    """

    def __init__(
        self,
        pipeline: str | os.PathLike[str] | PipelineConfig | None = None,
        **engine_kwargs: Any,
    ) -> None:
        # A caller's wrong arguments are the caller's: the TypeError itself,
        # before any thread starts (not a server error from the engine loop).
        inspect.signature(AsyncOmni).bind(pipeline, **engine_kwargs)
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
        sampling_params_list: None = ...,
        *,
        modalities: Iterable[str] | str = ...,
        params: Mapping[str, Any] | SamplingParams | None = ...,
        raise_on_error: bool = ...,
        timeout: float | None = ...,
        use_tqdm: bool | Callable[..., Any] = ...,
        py_generator: Literal[False] = ...,
        trace_headers: Mapping[str, str] | None = ...,
    ) -> OmniRequestOutput: ...

    @overload
    def generate(
        self,
        prompts: str | Sequence[str],
        sampling_params_list: Sequence[Any] | None = ...,
        *,
        modalities: Iterable[str] | str = ...,
        params: Mapping[str, Any] | SamplingParams | None = ...,
        raise_on_error: bool = ...,
        timeout: float | None = ...,
        use_tqdm: bool | Callable[..., Any] = ...,
        py_generator: Literal[True],
        trace_headers: Mapping[str, str] | None = ...,
    ) -> Iterator[OmniRequestOutput]: ...

    @overload
    def generate(
        self,
        prompts: str | Sequence[str],
        sampling_params_list: Sequence[Any] | None = ...,
        *,
        modalities: Iterable[str] | str = ...,
        params: Mapping[str, Any] | SamplingParams | None = ...,
        raise_on_error: bool = ...,
        timeout: float | None = ...,
        use_tqdm: bool | Callable[..., Any] = ...,
        py_generator: Literal[False] = ...,
        trace_headers: Mapping[str, str] | None = ...,
    ) -> list[OmniRequestOutput]: ...

    def generate(
        self,
        prompts: str | Sequence[str],
        sampling_params_list: Sequence[Any] | None = None,
        *,
        modalities: Iterable[str] | str = ("text",),
        params: Mapping[str, Any] | SamplingParams | None = None,
        raise_on_error: bool = True,
        timeout: float | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        py_generator: bool = False,
        trace_headers: Mapping[str, str] | None = None,
    ) -> OmniRequestOutput | list[OmniRequestOutput] | Iterator[OmniRequestOutput]:
        """Run prompts to completion; the final output of each.

        vllm-omni's call, ``generate(prompts, sampling_params_list)``, has
        vllm-omni's shapes: a list of outputs in the order of the prompts
        (also for one prompt), or with ``py_generator=True`` an iterator of
        each prompt's final output as it finishes. Entry *i* of
        ``sampling_params_list`` configures stage *i* (a mapping or
        upstream's ``SamplingParams``; see ``AsyncOmni.generate``). Called
        without a list (and without ``py_generator``), a string gives one
        output and a list of strings a list.

        Prompts run concurrently, with vLLM's "Processed prompts" progress
        bar on stderr while they do (``use_tqdm=False``: none; a callable:
        used in place of ``tqdm``). With ``raise_on_error`` (default) the
        first failure in prompt order (in finishing order for an iterator)
        is raised; otherwise failed prompts return an output with
        ``details`` set and ``finished=True``. Prompts that are not a string
        or a list of strings, or a list that does not fit the pipeline,
        raise ``VLLMValidationError`` (``prompts[i]``,
        ``sampling_params_list.1.top_k``) before anything runs; a call
        after ``close`` raises ``OmniServiceUnavailableError``.
        ``trace_headers`` (W3C ``traceparent``/``tracestate``): the trace
        every prompt's request joins (``AsyncOmni.generate``). ``timeout``
        (seconds, for the whole call) raises ``OmniStageTimeoutError``
        (504). Whatever ends the wait early (timeout, Ctrl-C, any
        exception, an iterator closed early) aborts every request of the
        call in every stage first.
        """
        self._check_open()
        single = isinstance(prompts, str)
        vllm_omni_call = sampling_params_list is not None or py_generator
        try:
            batch = [prompts] if single else _prompt_list(prompts)
            wanted = parse_modalities(modalities)
            per_stage_params(self.engine.config.stages, sampling_params_list)
            progress = _progress(use_tqdm, len(batch))
        except Exception as exc:  # an entry's 404 (an unknown voice) too
            raise_for_caller(exc)
        call = _Call(
            batch, wanted, params, sampling_params_list, progress, trace_headers
        )
        if py_generator:
            return self._iterate(call, raise_on_error, timeout)
        future = asyncio.run_coroutine_threadsafe(
            self._run_all(call, raise_on_error), self._loop
        )
        try:
            outputs = self._wait(future, call, timeout)
        finally:
            progress.close()
        return outputs[0] if single and not vllm_omni_call else outputs

    def _wait(
        self,
        future: concurrent.futures.Future[_T],
        call: _Call,
        timeout: float | None,
    ) -> _T:
        """The call's result; its requests aborted if the wait ends early."""
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            self._abort(future, call.request_ids, "abort")
            raise_for_caller(
                OmniStageTimeoutError(
                    f"The request did not finish within {timeout:g} s."
                )
            )
        except BaseException:
            # Ctrl-C lands here while this thread waits; the work is on the
            # loop thread and would run on in every stage without the abort.
            self._abort(future, call.request_ids, "cancelled")
            raise

    def _iterate(
        self, call: _Call, raise_on_error: bool, timeout: float | None
    ) -> Iterator[OmniRequestOutput]:
        """``py_generator``: each prompt's final output as it finishes."""
        finished: queue.SimpleQueue[OmniRequestOutput | BaseException] = (
            queue.SimpleQueue()
        )
        future = asyncio.run_coroutine_threadsafe(
            self._run_each(call, raise_on_error, finished.put), self._loop
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for _ in call.prompts:
                left = None if deadline is None else deadline - time.monotonic()
                try:
                    item = finished.get(timeout=left)
                except queue.Empty:
                    self._wait(future, call, 0)
                    raise
                if isinstance(item, BaseException):
                    raise item
                yield item
            self._wait(future, call, None)
        finally:
            call.progress.close()
            if not future.done():
                self._abort(future, call.request_ids, "cancelled")

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
        self, call: _Call, raise_on_error: bool
    ) -> list[OmniRequestOutput]:
        results = await asyncio.gather(
            *(
                self._run_one(call, prompt, request_id)
                for prompt, request_id in zip(
                    call.prompts, call.request_ids, strict=True
                )
            ),
            return_exceptions=True,
        )
        return [
            _result(call, request_id, result, raise_on_error)
            for request_id, result in zip(call.request_ids, results, strict=True)
        ]

    async def _run_each(
        self,
        call: _Call,
        raise_on_error: bool,
        put: Callable[[OmniRequestOutput | BaseException], None],
    ) -> None:
        """Each prompt's result handed to ``put`` as it finishes (a failure
        as the exception, with ``raise_on_error``)."""

        async def one(prompt: str, request_id: str) -> None:
            try:
                output = await self._run_one(call, prompt, request_id)
            except Exception as exc:
                if raise_on_error:
                    put(exc)
                    return
                output = _failed_output(exc, request_id, call.modalities)
            put(output)

        await asyncio.gather(
            *(
                one(prompt, request_id)
                for prompt, request_id in zip(
                    call.prompts, call.request_ids, strict=True
                )
            )
        )

    async def _run_one(
        self, call: _Call, prompt: str, request_id: str
    ) -> OmniRequestOutput:
        final: OmniRequestOutput | None = None
        try:
            async for output in self.engine.generate(
                prompt,
                request_id=request_id,
                modalities=call.modalities,
                params=call.params,
                sampling_params_list=call.sampling_params_list,
                trace_headers=call.trace_headers,
            ):
                final = output
        finally:
            call.progress.update(1)
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


@dataclass(slots=True)
class _Call:
    """One ``generate`` call: its prompts, their request ids, what they ask
    for, and its progress bar."""

    prompts: list[str]
    modalities: tuple[str, ...]
    params: Mapping[str, Any] | SamplingParams | None
    sampling_params_list: Sequence[Any] | None
    progress: Any
    trace_headers: Mapping[str, str] | None = None
    request_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.request_ids = [f"omni-{uuid.uuid4().hex}" for _ in self.prompts]


def _result(
    call: _Call,
    request_id: str,
    result: OmniRequestOutput | BaseException,
    raise_on_error: bool,
) -> OmniRequestOutput:
    if not isinstance(result, BaseException):
        return result
    if raise_on_error or not isinstance(result, Exception):
        raise result
    return _failed_output(result, request_id, call.modalities)


def _progress(use_tqdm: object, total: int) -> Any:
    """vLLM's ``LLM.generate`` bar ("Processed prompts", on stderr), a
    caller's ``tqdm``-like callable, or a bar that is never shown."""
    if isinstance(use_tqdm, bool):
        factory: Callable[..., Any] = tqdm
    elif callable(use_tqdm):
        factory = use_tqdm
    else:
        raise VLLMValidationError(
            "use_tqdm must be a bool or a tqdm-like callable", parameter="use_tqdm"
        )
    return factory(
        total=total,
        desc="Processed prompts",
        dynamic_ncols=True,
        disable=use_tqdm is False,
    )


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
                "each prompt must be a string", parameter=f"prompts.{index}"
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
