"""A stage process that speaks vllm-omni 0.30's error record, for the drills.

Run as ``python -m tests.engine.stage_030 --connect ADDR --pipeline PATH
--stage-id N``: this tree's stage worker (a remote stage), except that its
error records leave as 0.30's own ``ErrorMessage`` Struct, executed from the
published wheel (``tests.wheel030``), in the shapes 0.30's code writes:

- a client error with its status and type;
- a stage's own failure without either;
- an engine death as ``fatal=True`` without either, its text the cause.

Its stage needs ``legacy_wire: true`` in the pipeline, so its ``ready`` says
wire 1 (a 0.30 stage does not say) and it is never welcomed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import msgspec

from tests.wheel030 import messages_030
from vllm_omni.config import load_pipeline
from vllm_omni.engine.stage_worker import StageWorker, WorkerSpec, configure_logging
from vllm_omni.wire import messages as m


def as_030(message: m.ErrorMessage) -> msgspec.Struct:
    """``message`` as a 0.30 stage would have written it."""
    details = message.to_details()
    old = messages_030().ErrorMessage
    ids = {"request_id": details.request_id, "stage_id": details.stage_id}
    if details.fatal:
        return old(error=message.reason or details.message, fatal=True, **ids)
    if details.is_client:
        return old(
            error=details.message,
            status_code=details.status_code,
            error_type=details.error_type,
            **ids,
        )
    return old(error=details.message, **ids)


class Stage030(StageWorker):
    """A stage worker whose error records are 0.30's."""

    def _send(self, message: m.Message) -> None:
        if not isinstance(message, m.ErrorMessage):
            super()._send(message)
            return
        assert self._socket is not None
        self._socket.send(msgspec.msgpack.encode(as_030(message)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connect", required=True)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--stage-id", type=int, required=True)
    args = parser.parse_args(argv)
    configure_logging(args.stage_id, logging.INFO, True)
    pipeline = load_pipeline(args.pipeline)
    stage = pipeline.stage(args.stage_id)
    assert stage.legacy_wire, "a 0.30 stage is never welcomed: set legacy_wire"
    worker = Stage030(
        WorkerSpec(
            stage=stage,
            pipeline=pipeline,
            address=args.connect,
            orchestrator_timeout_s=30.0,
        )
    )
    try:
        return asyncio.run(worker.serve())
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
