"""What a stage publishes it accepts (``stage_ranges``) is what it accepts.

The OpenAPI document reads the ranges through the registry; each bound is
held here against the stage's own check (``check_stage_params``), just
inside and just outside, so that a range and its check cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_omni.errors import VLLMError
from vllm_omni.stages import (
    STAGE_KINDS,
    check_stage_params,
    stage_range,
    stage_ranges,
)
from vllm_omni.stages.ranges import (
    Choices,
    Integers,
    Numbers,
    ParamRange,
    Sizes,
    Strings,
)


def _inside_and_outside(value: ParamRange) -> tuple[list[Any], list[Any]]:
    """Values the range admits, and values just past it."""
    if isinstance(value, Integers):
        return [value.low, value.high], [value.low - 1, value.high + 1, 1.5, True]
    if isinstance(value, Numbers):
        return [value.low, value.high], [value.low - 0.01, value.high + 0.01, "1"]
    if isinstance(value, Choices):
        return list(value.values), ["no-such-choice", 1]
    if isinstance(value, Sizes):
        low, high, step = value.low, value.high, value.step
        return [f"{low}x{high}", f"{high}x{low}"], [
            f"{low - step}x{low}",
            f"{high + step}x{high}",
            f"{low + 1}x{low}",
            f"{low}by{low}",
        ]
    assert isinstance(value, Strings)
    most = ["s"] * value.max_items
    return ["s", most], [[*most, "s"], 1]


PUBLISHED = [
    pytest.param(kind, name, value, id=f"{kind}.{name}")
    for kind in STAGE_KINDS
    for name, value in (stage_ranges(kind) or {}).items()
]


def test_the_reference_stages_publish_their_ranges() -> None:
    published = {kind: stage_ranges(kind) for kind in STAGE_KINDS}
    assert published["vllm"] is None  # upstream's SamplingParams checks them
    assert published["guardrail"] == published["vocoder"] == {}
    assert set(published["text"] or {}) == {
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "seed",
        "stop",
        "n",
    }
    assert set(published["talker"] or {}) == {"voice", "speed"}
    assert set(published["image"] or {}) == {"n", "size", "seed"}
    assert set(published["video"] or {}) == {"seconds", "size", "fps", "seed"}
    assert len(PUBLISHED) == 15


@pytest.mark.parametrize(("kind", "name", "value"), PUBLISHED)
def test_a_published_range_is_the_stages_check(
    kind: str, name: str, value: ParamRange
) -> None:
    inside, outside = _inside_and_outside(value)
    for admitted in inside:
        check_stage_params(kind, {name: admitted})
    for refused in outside:
        with pytest.raises(VLLMError):
            check_stage_params(kind, {name: refused})


def test_one_range_is_asked_for_by_kind_name_and_type() -> None:
    assert stage_range("image", "size", Sizes) == Sizes(64, 1024)
    # A reader whose idea of a stage is out of date fails at once.
    with pytest.raises(RuntimeError, match="publishes no Choices for 'size'"):
        stage_range("image", "size", Choices)
    with pytest.raises(RuntimeError, match="publishes no Integers for 'n'"):
        stage_range("vllm", "n", Integers)
