"""``vllm_omni.outputs``: 0.30's flat error fields and error constructors
stay for one release, derived from ``details`` (issue 22).

The same promises are checked against the published 0.30.0 tree in
``tests/errors/test_compat_030.py``; these run without it.
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from typing import Any

import pytest

from vllm_omni.errors import OmniClientError, normalize
from vllm_omni.errors.details import GENERIC_SERVER_MESSAGE, OmniErrorDetails
from vllm_omni.outputs import DiffusionOutput, OmniRequestOutput

FAILED = OmniErrorDetails(
    "no such voice", "client", 404, "NotFoundError", request_id="r-1", stage_id=2
)
FLAT = {
    "error": "message",
    "error_status_code": "status_code",
    "error_type": "error_type",
}


def _read(output: Any, field: str) -> Any:
    """Read a deprecated field: one DeprecationWarning, at this line."""
    with pytest.warns(DeprecationWarning, match=f"flat field {field} ") as caught:
        value = getattr(output, field)
    assert [w.filename for w in caught] == [__file__]
    return value


@pytest.mark.parametrize(
    "output",
    [
        OmniRequestOutput("r-1", finished=True, details=FAILED),
        DiffusionOutput(details=FAILED),
    ],
    ids=["request", "diffusion"],
)
def test_the_flat_fields_are_read_from_details(output: Any) -> None:
    for field, source in FLAT.items():
        assert _read(output, field) == getattr(FAILED, source)
    # Never stored beside the record: a changed record changes them.
    assert not set(FLAT) & {f.name for f in dataclasses.fields(output)}
    output.details = dataclasses.replace(
        FAILED, status_code=409, error_type="ConflictError"
    )
    assert _read(output, "error_status_code") == 409


@pytest.mark.parametrize("output", [OmniRequestOutput("r-2"), DiffusionOutput()])
def test_a_success_has_no_flat_error(output: Any) -> None:
    assert [_read(output, field) for field in FLAT] == [None, None, None]


@pytest.mark.parametrize(
    ("status", "error_type", "expected"),
    [
        (404, "NotFoundError", ("no voice", "client", 404, "NotFoundError")),
        (409, None, ("no voice", "client", 409, "ConflictError")),
        (
            502,
            "NativeKVHandoffError",
            ("no voice", "server", 502, "NativeKVHandoffError"),
        ),
        # No status: a stage's own failure, a server 500 (0.30 raised its
        # EngineGenerateError for it), with the generic text.
        (None, None, (GENERIC_SERVER_MESSAGE, "server", 500, "InternalServerError")),
        (
            None,
            "BadRequestError",
            (GENERIC_SERVER_MESSAGE, "server", 500, "InternalServerError"),
        ),
    ],
)
def test_from_error_reads_its_flat_fields_as_a_030_record(
    status: int | None, error_type: str | None, expected: tuple[Any, ...]
) -> None:
    with pytest.warns(DeprecationWarning, match="from_error") as caught:
        output = OmniRequestOutput.from_error(
            "r-3", "no voice", status_code=status, error_type=error_type
        )
    assert [w.filename for w in caught] == [__file__]
    assert output.finished and output.request_id == "r-3" and output.failed
    details = output.details
    assert details is not None
    assert (
        details.message,
        details.category,
        details.status_code,
        details.error_type,
    ) == (expected)
    assert details.request_id == "r-3" and not details.fatal


@pytest.mark.parametrize(
    "exc",
    [
        OmniClientError("bad seed", status_code=422),
        RuntimeError("boom at /home/alice/x.py"),
    ],
)
def test_from_exception_is_normalize(exc: Exception) -> None:
    with pytest.warns(DeprecationWarning, match="from_exception") as caught:
        output = DiffusionOutput.from_exception(exc)
    assert [w.filename for w in caught] == [__file__]
    assert output.details == normalize(exc)
    assert output.images == [] and output.video is None


def test_outputs_with_flat_fields_still_pickle() -> None:
    output = OmniRequestOutput("r-4", finished=True, details=FAILED)
    copy = pickle.loads(pickle.dumps(output))
    assert copy == output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert copy.error == FAILED.message
