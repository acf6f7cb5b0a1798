"""The guardrail stage: rejects a prompt that contains a blocklisted term.

Raises ``GuardrailViolationError`` (400) without repeating the term or the
prompt; a passing request gets a ``verdict`` (docs/runtime.md §1).
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
