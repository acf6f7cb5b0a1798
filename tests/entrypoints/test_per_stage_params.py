"""``sampling_params_list`` read against a pipeline, and how an entry and the
request's own fields combine for its stage: properties over any list."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni.config import load_pipeline
from vllm_omni.engine.input_processor import for_stage as _for_stage
from vllm_omni.entrypoints.sampling_params_list import per_stage_params
from vllm_omni.errors import VLLMValidationError

STAGES = load_pipeline("reference").stages
THINKER = 1

_values = st.one_of(st.none(), st.integers(1, 4096), st.floats(0, 2), st.text())
_keys = st.sampled_from(
    ["max_tokens", "max_completion_tokens", "temperature", "seed", "stop", "n"]
)


@given(st.lists(st.none(), min_size=len(STAGES) + 1, max_size=3 * len(STAGES)))
def test_a_list_longer_than_the_pipeline_is_refused_whole(entries: list[Any]) -> None:
    with pytest.raises(VLLMValidationError) as info:
        per_stage_params(STAGES, entries)
    assert info.value.parameter == "sampling_params_list"


@given(st.lists(st.one_of(st.none(), st.just({})), max_size=len(STAGES)))
def test_empty_entries_keep_every_default(entries: list[Any]) -> None:
    assert per_stage_params(STAGES, entries) == {}


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_a_thinker_entry_is_kept_for_the_thinker(entry: int, request: int) -> None:
    chosen = per_stage_params(STAGES, [None, {"max_tokens": entry}])
    assert chosen == {THINKER: {"max_tokens": entry}}
    for key in ("max_tokens", "max_completion_tokens"):
        merged = _for_stage({key: request, "seed": 3}, chosen[THINKER])
        # The entry wins (the two length limits are one setting); a field the
        # entry does not set still applies.
        assert merged == {"max_tokens": entry, "seed": 3}


@given(st.dictionaries(_keys, _values), st.dictionaries(_keys, _values))
def test_the_entry_wins_key_by_key(
    request: dict[str, Any], entry: dict[str, Any]
) -> None:
    merged = _for_stage(request, entry)
    assert {key: merged[key] for key in entry} == entry
    limits = {"max_tokens", "max_completion_tokens"}
    untouched = set(request) - set(entry) - (limits if limits & set(entry) else set())
    assert {key: merged[key] for key in untouched} == {
        key: request[key] for key in untouched
    }
    assert set(merged) == set(entry) | untouched
