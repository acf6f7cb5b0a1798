"""A stage process whose ``vllm`` stage runs the stand-in of vLLM 0.34's
fault-tolerant engine, for the drills.

Run as ``python -m tests.engine.fault_tolerant_stage --connect ADDR
--pipeline PATH --stage-id N`` (a ``remote: true`` stage of the pipeline):
this tree's stage worker, every line of it, with ``kind: vllm`` built as
``FaultTolerantVLLMStage`` (``tests/engine/fault_tolerant_llm.py``), so its
engine's status travels with its heartbeats and its recoveries over the wire.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from vllm_omni.engine import stage_worker
from vllm_omni.stages import STAGE_KINDS


def main(argv: Sequence[str] | None = None) -> int:
    STAGE_KINDS["vllm"] = "tests.engine.fault_tolerant_llm:FaultTolerantVLLMStage"
    return stage_worker.main(argv)


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
