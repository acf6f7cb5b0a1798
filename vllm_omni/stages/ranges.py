"""The values a stage accepts for a request parameter, as data.

A stage declares them on its class (``Stage.RANGES``) from the constants its
checks use; ``vllm_omni.stages.stage_ranges`` hands them to whoever describes
requests (the OpenAPI document) without importing the stage by name.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "SIZE_STEP",
    "Choices",
    "Integers",
    "Numbers",
    "ParamRange",
    "Sizes",
    "Strings",
]

# Each side of a size is a multiple of this.
SIZE_STEP = 8


@dataclass(frozen=True, slots=True)
class Integers:
    """An integer from ``low`` to ``high``."""

    low: int
    high: int


@dataclass(frozen=True, slots=True)
class Numbers:
    """A number from ``low`` to ``high``."""

    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Choices:
    """One of ``values``."""

    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sizes:
    """``WxH``, each side from ``low`` to ``high`` and a multiple of ``step``."""

    low: int
    high: int
    step: int = SIZE_STEP


@dataclass(frozen=True, slots=True)
class Strings:
    """A non-empty string, or a list of at most ``max_items`` of them."""

    max_items: int


ParamRange = Integers | Numbers | Choices | Sizes | Strings
