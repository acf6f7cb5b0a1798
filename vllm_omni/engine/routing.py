"""Which stages a request for some modalities goes through, in order."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.errors import OmniServiceUnavailableError, VLLMValidationError

__all__ = ["MODALITIES", "Routes"]

MODALITIES = ("text", "audio", "image", "video")
# Stage kinds that produce each modality, in route order.
_PRODUCERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "text": (("text", "vllm"),),
    "audio": (("talker",), ("vocoder",)),
    "image": (("image",),),
    "video": (("video",),),
}


class Routes:
    """The routes of one pipeline: what it can produce, and through which stages."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline
        self.modalities = frozenset(
            modality
            for modality, chain in _PRODUCERS.items()
            if all(self._first_of(kinds) is not None for kinds in chain)
        )
        # Each set of modalities served so far, and its route: at most one
        # entry for each subset of ``MODALITIES`` that has a route.
        self._known: dict[frozenset[str], tuple[StageConfig, ...]] = {}

    def stage_for(self, modality: str) -> StageConfig | None:
        """The first stage producing ``modality`` (its first producer kind)."""
        chain = _PRODUCERS.get(modality)
        return self._first_of(chain[0]) if chain else None

    def _first_of(self, kinds: tuple[str, ...]) -> StageConfig | None:
        return next((s for s in self.pipeline.stages if s.kind in kinds), None)

    def route(self, modalities: Iterable[str]) -> tuple[StageConfig, ...]:
        """The stages a request for ``modalities`` goes through, in order.

        Raises before anything is sent: ``VLLMValidationError`` (modalities)
        for an unknown modality or combination, ``OmniServiceUnavailableError``
        (503) when this pipeline has no stage for a requested modality.
        """
        wanted = frozenset(modalities)
        known = self._known.get(wanted)
        if known is not None:
            return known
        unknown = wanted - set(MODALITIES)
        if unknown or not wanted:
            raise VLLMValidationError(
                f"modalities must be a non-empty subset of {', '.join(MODALITIES)}",
                parameter="modalities",
            )
        for modality in MODALITIES:
            if modality in wanted and modality not in self.modalities:
                raise OmniServiceUnavailableError(f"pipeline has no {modality} stage")
        if len(wanted) > 1 and wanted & {"image", "video"}:
            raise VLLMValidationError(
                "image and video requests cannot be combined with other modalities",
                parameter="modalities",
            )
        route = [s for s in self.pipeline.stages if s.kind == "guardrail"]
        for modality in MODALITIES:
            if modality in wanted:
                for kinds in _PRODUCERS[modality]:
                    stage = self._first_of(kinds)
                    assert stage is not None
                    route.append(stage)
        self._known[wanted] = found = tuple(route)
        return found
