"""``vllm_omni.errors.logs``: every log record's credentials are redacted."""

from __future__ import annotations

import io
import logging
import traceback
from collections.abc import Iterator

import pytest

from vllm_omni.errors.logs import install_log_redaction
from vllm_omni.errors.sanitize import redact_credentials

SECRET = "hf_AbCdEfGhIjKlMnOp42"
TEXT = f"failed reading /home/alice/.hf/token {SECRET} password=hunter2"


@pytest.fixture()
def stream() -> Iterator[io.StringIO]:
    """A handler on a logger of its own, records made by the redacting factory."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tests.errors.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    factory = logging.getLogRecordFactory()
    install_log_redaction()
    install_log_redaction()  # idempotent: one layer of redaction
    try:
        yield out
    finally:
        logging.setLogRecordFactory(factory)
        logger.removeHandler(handler)


def test_message_arguments_and_traceback(stream: io.StringIO) -> None:
    logger = logging.getLogger("tests.errors.logs")
    try:
        raise RuntimeError(TEXT)
    except RuntimeError as exc:
        logger.error("request %s failed: %s", "req-7", exc, exc_info=True)
    line = stream.getvalue()
    assert SECRET not in line and "hunter2" not in line
    # The operator keeps the request id, the path and the whole traceback.
    assert line.startswith(
        "ERROR request req-7 failed: failed reading /home/alice/.hf/token "
        "<redacted> password=<redacted>\nTraceback (most recent call last):\n"
    )
    assert 'File "' in line and __file__ in line
    assert line.rstrip().endswith(
        "RuntimeError: failed reading /home/alice/.hf/token <redacted> "
        "password=<redacted>"
    )


def test_arguments_a_formatter_reads_directly(stream: io.StringIO) -> None:
    """uvicorn's access formatter reads ``record.args``, not the message."""
    seen: list[object] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.args)

    logger = logging.getLogger("tests.errors.logs")
    capture = Capture()
    logger.addHandler(capture)
    try:
        logger.info('%s "%s %s" %d', "127.0.0.1", "GET", f"/v1/x?token={SECRET}", 200)
    finally:
        logger.removeHandler(capture)
    assert seen == [("127.0.0.1", "GET", "/v1/x?token=<redacted>", 200)]


@pytest.mark.parametrize(
    ("msg", "args", "expected"),
    [
        # The line holds no credential: the arguments are kept as they are.
        ("request %s refused (%s)", ("req-9", "overload"), ("req-9", "overload")),
        # A secret only its argument shows whole (the line cuts it).
        ("first part %.6s", (SECRET,), ("<redacted>",)),
        # A secret the line shows, in an argument of its own.
        ("%s said %s", ("proxy", f"Bearer {SECRET}"), ("proxy", "Bearer <redacted>")),
        # A line that cannot be made: each argument on its own.
        ("%s %s %s", (f"token={SECRET}",), ("token=<redacted>",)),
    ],
)
def test_arguments_are_checked_whole_wherever_the_line_hides_them(
    stream: io.StringIO, msg: str, args: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    record = logging.getLogger("tests.errors.logs").makeRecord(
        "tests.errors.logs", logging.INFO, __file__, 1, msg, args, None
    )
    assert record.args == expected
    if args == expected:
        assert record.args is args  # not rebuilt


def test_stack_info_and_text_that_is_not_unicode(stream: io.StringIO) -> None:
    logger = logging.getLogger("tests.errors.logs")
    logger.warning("model \ud800 with Bearer %s", SECRET, stack_info=True)
    line = stream.getvalue()
    assert line.startswith("WARNING model \ufffd with Bearer <redacted>\nStack")
    line.encode("utf-8")


def test_a_foreign_record_class_keeps_its_behaviour() -> None:
    class Tagged(logging.LogRecord):
        def getMessage(self) -> str:
            return "tagged " + super().getMessage()

    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(Tagged)
    install_log_redaction()
    try:
        record = logging.getLogger("x").makeRecord(
            "x", logging.INFO, __file__, 1, "key=%s", (SECRET,), None
        )
    finally:
        logging.setLogRecordFactory(factory)
    assert isinstance(record, Tagged)
    assert record.getMessage() == "tagged key=<redacted>"


def test_redact_credentials_keeps_everything_else() -> None:
    try:
        raise ValueError(f"open {TEXT}")
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    redacted = redact_credentials(text)
    assert redacted == text.replace(SECRET, "<redacted>").replace(
        "hunter2", "<redacted>"
    )
