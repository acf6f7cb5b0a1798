"""The requests in flight: admission, per-stage slots, deadlines and aborts."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator

from vllm.exceptions import QueueOverflowError

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.stage_channel import StageChannel
from vllm_omni.errors import (
    OmniConflictError,
    OmniStageTimeoutError,
    VLLMValidationError,
    sanitize_request_id,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import (
    ABORTS_TOTAL,
    ADMISSION_REJECTIONS_TOTAL,
    ENGINE_WIDE,
    REQUESTS_IN_FLIGHT,
    AbortReason,
)
from vllm_omni.errors.normalizer import stage_failure
from vllm_omni.wire import messages as m

__all__ = [
    "ABORTED",
    "DEFAULT_MAX_NUM_QUEUED_REQS",
    "Aborted",
    "AdmissionHolds",
    "Mailbox",
    "Request",
    "RequestTable",
    "refuse_over_limit",
    "release_held_place",
]

logger = logging.getLogger(__name__)

# Requests in flight per engine before admission refuses (upstream's
# ``--max-num-queued-reqs``); big enough for bursts, small enough that the
# queued work drains well inside a typical stage deadline.
DEFAULT_MAX_NUM_QUEUED_REQS = 1024


def refuse_over_limit(request_id: str, in_flight: int, limit: int) -> None:
    """Raise upstream's ``QueueOverflowError`` (503), counted once, when
    ``in_flight`` requests already fill the engine-wide ``limit``: the
    engine's own check and an API server process's early one (which reads
    the count from the admission board) refuse the same way."""
    if in_flight >= limit:
        ADMISSION_REJECTIONS_TOTAL.labels("max_num_queued_reqs", ENGINE_WIDE).inc()
        logger.debug(
            "request %s refused: %d requests in flight (max %d)",
            request_id,
            in_flight,
            limit,
        )
        raise QueueOverflowError()


class _Place:
    """One place an ``AdmissionHolds`` keeps, given back once."""

    __slots__ = ("_holds",)

    def __init__(self, holds: AdmissionHolds) -> None:
        self._holds: AdmissionHolds | None = holds

    def release(self) -> None:
        if self._holds is not None:
            self._holds.changed(-1)
            self._holds = None


# The place held for the request this context serves (an HTTP route's task).
_HELD: contextvars.ContextVar[_Place | None] = contextvars.ContextVar(
    "vllm_omni_admission_place", default=None
)


class AdmissionHolds:
    """Places held for requests that passed the early admission check of an
    HTTP route (issue 46) and have not reached admission proper yet.

    A route that passed the check lets the requests that arrived with it be
    answered first (a burst's refusals go out before the admitted requests'
    work). Its place is held meanwhile, so that the requests behind it are
    counted against the limit with it: without it, every request of a burst
    would pass the early check before the first is admitted. The place is
    given back when the request is admitted (``release_held_place``, in the
    same context) or when the route ends, whichever comes first.
    """

    def __init__(self, published: Callable[[int], None] | None = None) -> None:
        self.count = 0
        # Told the number of places whenever it changes (another process
        # counts them: ``engine_rpc.AdmissionBoard``).
        self._published = published

    def changed(self, by: int) -> None:
        self.count += by
        if self._published is not None:
            self._published(self.count)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        place = _Place(self)
        self.changed(+1)
        token = _HELD.set(place)
        try:
            yield
        finally:
            _HELD.reset(token)
            place.release()


def release_held_place() -> None:
    """The request this context serves reached admission: the place held for
    it (if any) is given back, since it is counted as in flight from now on."""
    place = _HELD.get()
    if place is not None:
        place.release()


class Aborted:
    """Queue marker: the request was aborted through ``abort()``."""


ABORTED = Aborted()

Delivery = m.Output | BaseException | Aborted


class Mailbox:
    """What reaches one request for its one reader, in order: the
    ``put_nowait``/``get``/``empty`` of an ``asyncio.Queue`` without its
    size limit, its task accounting and its list of waiting readers (a
    request has one reader). One is made for every request, and every
    output passes through it."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Delivery] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: Delivery) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Delivery:
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.popleft()


@dataclasses.dataclass(slots=True, eq=False)
class Request:
    """One in-flight request: where it is and where its results go."""

    request_id: str
    # The id on the wire: the caller's id when it is a safe token, else a
    # generated one, so error records (which drop unsafe ids) still route.
    wire_id: str
    queue: Mailbox
    stage: StageConfig | None = None
    # The stage whose admission slot the request holds (until that stage
    # finished it, or the request ended).
    slot: StageConfig | None = None
    timer: asyncio.TimerHandle | None = None
    # Set once the request failed, timed out, was cancelled or completed:
    # later messages for it are dropped.
    closed: bool = False


class RequestTable:
    """Every request in flight, by the caller's id and by its wire id.

    Admission: at most ``max_num_queued_reqs`` requests in flight, and a
    stage with its own ``max_num_queued_reqs`` holds at most that many; one
    more is refused at once with upstream's ``QueueOverflowError`` (503).
    """

    def __init__(
        self, pipeline: PipelineConfig, max_num_queued_reqs: int, channel: StageChannel
    ) -> None:
        if (
            isinstance(max_num_queued_reqs, bool)
            or not isinstance(max_num_queued_reqs, int)
            or max_num_queued_reqs < 1
        ):
            raise VLLMValidationError(
                "max_num_queued_reqs must be a positive integer",
                parameter="max_num_queued_reqs",
            )
        self.max_num_queued_reqs = max_num_queued_reqs
        self._channel = channel
        self._requests: dict[str, Request] = {}
        self._by_wire: dict[str, Request] = {}
        # Requests each stage holds, for the stages' own admission limits.
        self._stage_load = {stage.id: 0 for stage in pipeline.stages}
        # Told the number in flight whenever it changes (the admission board
        # API server processes read: ``entrypoints.engine_rpc``).
        self.count_listener: Callable[[int], None] | None = None
        # Places held for requests an HTTP route let through early.
        self.holds = AdmissionHolds()
        for stage in pipeline.stages:
            if stage.max_num_queued_reqs is not None:
                ADMISSION_REJECTIONS_TOTAL.labels("max_num_queued_reqs", str(stage.id))

    def __len__(self) -> int:
        return len(self._requests)

    def check_new(self, request_id: str) -> None:
        """Refuse an id already in flight (409)."""
        if request_id in self._requests:
            raise OmniConflictError("A request with this id is already in flight.")

    def check_admission(self, request_id: str) -> None:
        """Refuse ``request_id`` when the engine holds its maximum already:
        upstream's ``QueueOverflowError`` (503), counted once. ``open`` asks
        it, and an HTTP route asks it before it reads its body (issue 46).
        The places held for requests let through early count as in flight."""
        refuse_over_limit(
            request_id,
            len(self._requests) + self.holds.count,
            self.max_num_queued_reqs,
        )

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """``check_admission``, then a place held for ``request_id`` until it
        is admitted or the context ends (``AdmissionHolds``)."""
        self.check_admission(request_id)
        return self.holds.hold()

    def open(self, request_id: str) -> Request:
        """Admit a request (or refuse it: the engine holds its maximum)."""
        release_held_place()
        self.check_admission(request_id)
        safe = sanitize_request_id(request_id) == request_id
        wire_id = request_id if safe else f"omni-{uuid.uuid4().hex}"
        request = Request(request_id, wire_id, Mailbox())
        self._requests[request_id] = request
        self._by_wire[wire_id] = request
        REQUESTS_IN_FLIGHT.inc()
        if self.count_listener is not None:
            self.count_listener(len(self._requests))
        return request

    def remove(self, request: Request) -> None:
        """The request ended, however: it leaves the table and its slot."""
        request.closed = True
        self.cancel_timer(request)
        self.release(request)
        self._requests.pop(request.request_id, None)
        self._by_wire.pop(request.wire_id, None)
        REQUESTS_IN_FLIGHT.dec()
        if self.count_listener is not None:
            self.count_listener(len(self._requests))

    def _at_stage(self, stage_id: int) -> list[Request]:
        """The open requests a stage holds now."""
        return [
            r
            for r in self._requests.values()
            if not r.closed and r.stage is not None and r.stage.id == stage_id
        ]

    # -- what stages send ------------------------------------------------------

    def deliver(self, stage_id: int, output: m.Output) -> None:
        """A stage's output for a request it holds; dropped otherwise."""
        request = self._by_wire.get(output.request_id)
        if (
            request is not None
            and not request.closed
            and request.stage is not None
            and request.stage.id == stage_id
        ):
            if output.finished:
                # The stage met its deadline, however slowly this is read.
                self.cancel_timer(request)
            request.queue.put_nowait(output)

    def fail(self, stage_id: int, details: OmniErrorDetails) -> None:
        """A stage's nonfatal record fails its request."""
        request = self._by_wire.get(details.request_id or "")
        if request is None or request.closed:
            logger.warning("stage %d error for no live request: %s", stage_id, details)
            return
        self.close(request, stage_failure(details))

    # -- per-stage slots and deadlines -----------------------------------------

    def enter(self, request: Request, stage: StageConfig) -> None:
        """Take a slot in ``stage`` (or refuse the request: the stage holds
        its ``max_num_queued_reqs`` already, ``QueueOverflowError`` with its
        id) and start the stage's deadline."""
        limit = stage.max_num_queued_reqs
        if limit is not None and self._stage_load[stage.id] >= limit:
            ADMISSION_REJECTIONS_TOTAL.labels(
                "max_num_queued_reqs", str(stage.id)
            ).inc()
            logger.debug(
                "request %s refused: stage %d holds %d requests (max %d)",
                request.request_id,
                stage.id,
                self._stage_load[stage.id],
                limit,
            )
            error = QueueOverflowError()
            error.stage_id = stage.id  # type: ignore[attr-defined]
            raise error
        self._stage_load[stage.id] += 1
        request.slot = stage
        request.stage = stage
        if stage.timeout_s is not None:
            request.timer = asyncio.get_running_loop().call_later(
                stage.timeout_s, self._on_deadline, request, stage
            )

    def release(self, request: Request) -> None:
        """Give back the request's stage slot, once."""
        if request.slot is not None:
            self._stage_load[request.slot.id] -= 1
            request.slot = None

    def _on_deadline(self, request: Request, stage: StageConfig) -> None:
        if request.closed or request.stage is not stage:
            return
        logger.warning(
            "request %s: stage %d deadline of %g s expired",
            request.request_id,
            stage.id,
            stage.timeout_s,
        )
        self.close(
            request,
            OmniStageTimeoutError(
                f"Stage {stage.id} ({stage.name}) did not finish within "
                f"{stage.timeout_s:g} s.",
                stage_id=stage.id,
            ),
        )
        self.abort_everywhere(request, "timeout")

    @staticmethod
    def cancel_timer(request: Request) -> None:
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None

    # -- ends ------------------------------------------------------------------

    def abort(self, request_id: str, reason: AbortReason) -> None:
        """Abort an in-flight request in every stage; unknown or finished ids
        are ignored."""
        request = self._requests.get(request_id)
        if request is None or request.closed:
            return
        self.close(request, ABORTED)
        self.abort_everywhere(request, reason)

    def abort_everywhere(self, request: Request, reason: AbortReason | None) -> None:
        """Tell every stage; ``reason`` is counted (None: counted by the caller,
        or not an abort of the client's making)."""
        if reason is not None:
            ABORTS_TOTAL.labels(reason).inc()
        self._channel.broadcast(m.Abort(request_id=request.wire_id))

    def close(self, request: Request, error: BaseException | Aborted) -> None:
        """End the request with ``error`` (what its consumer raises)."""
        request.closed = True
        self.cancel_timer(request)
        self.release(request)
        request.queue.put_nowait(error)

    def close_all(self, error_for: Callable[[Request], BaseException]) -> None:
        for request in list(self._requests.values()):
            if not request.closed:
                self.close(request, error_for(request))

    def fail_at_stage(
        self,
        stage_id: int,
        error_for: Callable[[], BaseException],
        reason: AbortReason | None,
    ) -> int:
        """Fail every request a stage holds (aborted everywhere); how many."""
        stuck = self._at_stage(stage_id)
        for request in stuck:
            self.close(request, error_for())
            self.abort_everywhere(request, reason)
        return len(stuck)
