"""The guardrail stage: rejects a prompt that contains a blocklisted term.

Owns the blocklist check, done inside the stage process, and raises
``GuardrailViolationError`` (400). Its public message never repeats the
matched term or the prompt. It produces no content: a passing request gets a
``verdict`` and moves on to the next stage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from vllm_omni.errors import GuardrailViolationError
from vllm_omni.stages.base import Stage
from vllm_omni.wire.messages import Payload, Submit

__all__ = ["GuardrailStage"]


class GuardrailStage(Stage):
    """Case-insensitive substring blocklist from ``guardrail.blocklist``."""

    kind: ClassVar[str] = "guardrail"

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        prompt = request.prompt.casefold()
        if any(term.casefold() in prompt for term in self.pipeline.guardrail_blocklist):
            raise GuardrailViolationError(
                "The request was rejected by the content guardrail."
            )
        yield Payload(meta={"verdict": "pass"})
