"""vllm-omni's offline error path raises the semantic types with ``.details``.

Where a stage's error message or an engine output's error fields become
the exception a Python caller catches (``OmniBase``, the diffusion
engine), run on the tree's own code with the message built by hand: no
GPU, no engine. Client errors are ``VLLMClientError`` with their
``param``; server errors ``VLLMServerError``/``EngineGenerateError``; each
carries an ``OmniErrorDetails`` saying who is to blame.
"""

from __future__ import annotations

import types
from typing import Any

import pytest


def _details(exc: BaseException) -> Any:
    details = getattr(exc, "details", None)
    assert details is not None, f"{type(exc).__name__} has no .details"
    return details


def _message(**fields: Any) -> Any:
    from vllm_omni.engine.messages import ErrorMessage

    return ErrorMessage(
        error="top_k must be at least 1", request_id="r-1", stage_id=1, **fields
    )


@pytest.mark.parametrize(
    ("fields", "owner", "status"),
    [
        ({"status_code": 400, "error_type": "BadRequestError"}, "client", 400),
        ({"status_code": 404, "error_type": "NotFoundError"}, "client", 404),
        ({"status_code": 500, "error_type": "InternalServerError"}, "server", 500),
        ({}, "server", 500),
    ],
)
def test_stage_error_message_raises_the_semantic_type(
    fields: dict[str, Any], owner: str, status: int
) -> None:
    from vllm.exceptions import VLLMClientError, VLLMServerError
    from vllm_omni.entrypoints.omni_base import OmniBase

    with pytest.raises(Exception) as raised:
        OmniBase._raise_nonfatal_error_message(
            types.SimpleNamespace(), _message(**fields)
        )
    exc = raised.value
    expected = VLLMClientError if owner == "client" else VLLMServerError
    assert isinstance(exc, expected), f"{type(exc).__mro__} is no {expected.__name__}"
    details = _details(exc)
    assert (details.category, details.status_code) == (owner, status)


def test_stage_error_message_keeps_its_record() -> None:
    """A message carrying the record (``details``) is read by it: the
    parameter and the owner survive the stage boundary."""
    from vllm.exceptions import VLLMClientError
    from vllm_omni.entrypoints.omni_base import OmniBase

    from vllm_omni.errors import OmniErrorDetails

    record = OmniErrorDetails(
        "top_k must be at least 1", "client", 400, "BadRequestError", parameter="top_k"
    )
    message = _message(status_code=400, details=record.to_wire())
    with pytest.raises(VLLMClientError) as raised:
        OmniBase._raise_nonfatal_error_message(types.SimpleNamespace(), message)
    details = _details(raised.value)
    assert (details.parameter, details.stage_id) == ("top_k", 1)


def test_engine_output_error_raises_engine_generate_error_with_stage() -> None:
    from vllm.v1.engine.exceptions import EngineGenerateError
    from vllm_omni.entrypoints.omni_base import OmniBase

    outputs = types.SimpleNamespace(
        error="the decoder failed",
        error_status_code=500,
        error_type="InternalServerError",
    )
    result = types.SimpleNamespace(engine_outputs=outputs)
    engine = types.SimpleNamespace(errored=False)
    with pytest.raises(EngineGenerateError) as raised:
        OmniBase._check_engine_output_error(engine, result, "r-2", 2)
    details = _details(raised.value)
    assert (details.category, details.status_code, details.stage_id) == (
        "server",
        500,
        2,
    )


@pytest.mark.parametrize(("status", "owner"), [(422, "client"), (500, "server")])
def test_diffusion_output_error_raises_the_semantic_type(
    status: int, owner: str
) -> None:
    from vllm.exceptions import VLLMClientError, VLLMServerError
    from vllm_omni.diffusion.data import DiffusionOutput
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    output = DiffusionOutput(
        error="the image cannot be decoded", error_status_code=status
    )
    with pytest.raises(Exception) as raised:
        DiffusionEngine.postprocess_output(types.SimpleNamespace(), None, output)
    exc = raised.value
    expected = VLLMClientError if owner == "client" else VLLMServerError
    assert isinstance(exc, expected), f"{type(exc).__mro__} is no {expected.__name__}"
    assert (_details(exc).category, _details(exc).status_code) == (owner, status)


def test_stage_failure_message_carries_the_record() -> None:
    """The sender fills the record: the orchestrator's own code failing a
    request puts an ``ErrorMessage`` whose ``details`` says owner, status
    and stage, survives msgspec's wire and is what the receiver raises."""
    import asyncio

    import msgspec
    from vllm.exceptions import VLLMClientError
    from vllm_omni.engine.messages import ErrorMessage
    from vllm_omni.entrypoints.omni_base import OmniBase

    from vllm_omni.engine.orchestrator import Orchestrator
    from vllm_omni.errors import OmniErrorDetails

    async def fail() -> Any:
        orchestrator = object.__new__(Orchestrator)
        orchestrator.output_async_queue = asyncio.Queue()
        orchestrator._cfg_tracker = types.SimpleNamespace(cleanup_parent=lambda _: [])

        async def cleanup(*args: Any, **kwargs: Any) -> None:
            return None

        orchestrator._cleanup_request_ids = cleanup
        await Orchestrator._fail_request_client_error(
            orchestrator, "r-3", 1, "the reference audio is too short"
        )
        return orchestrator.output_async_queue.get_nowait()

    sent = asyncio.run(fail())
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=ErrorMessage)
    assert wire.details is not None, f"the sender filled no record: {wire}"
    record = OmniErrorDetails.from_wire(wire.details)
    assert (record.category, record.status_code, record.stage_id) == ("client", 400, 1)
    with pytest.raises(VLLMClientError) as raised:
        OmniBase._raise_nonfatal_error_message(types.SimpleNamespace(), wire)
    assert _details(raised.value).stage_id == 1


def test_stage_failure_without_status_carries_a_server_record() -> None:
    """A sender that says no status (a stage's own failure, as the
    orchestrator's CFG and replica paths send) carries a server-500 record."""
    from vllm_omni.engine.messages import ErrorMessage

    from vllm_omni.errors import OmniErrorDetails

    message = ErrorMessage(error="CFG companion lost", request_id="r-4", stage_id=2)
    assert message.details is not None, "the message carries no record"
    record = OmniErrorDetails.from_wire(message.details)
    assert (record.category, record.status_code, record.stage_id) == ("server", 500, 2)
