"""Checks a request's prompt and params before anything is sent to a stage,
and builds the params each stage reads."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from vllm_omni.config import StageConfig
from vllm_omni.errors import VLLMValidationError
from vllm_omni.errors.text import is_unicode
from vllm_omni.stages import check_stage_params, stage_params

__all__ = ["check_inputs", "for_stage"]

_PARAM_TYPES = (str, int, float, bool, bytes, type(None))
# Integers must fit the wire (msgpack carries 64-bit integers).
_INT_RANGE = range(-(2**63), 2**63)
# Request keys that set the same thing: an entry's one supersedes the others.
_SAME_SETTING = {
    "max_tokens": ("max_completion_tokens",),
    "max_completion_tokens": ("max_tokens",),
}


def check_inputs(
    prompt: object,
    params: object,
    per_stage: Mapping[int, Mapping[str, Any]],
    route: tuple[StageConfig, ...],
) -> None:
    """Raise ``VLLMValidationError`` (with its ``parameter``) for a prompt or
    a value that cannot travel to a stage, or a key no stage of ``route``
    reads."""
    if not isinstance(prompt, str):
        raise VLLMValidationError("prompt must be a string", parameter="prompt")
    if not is_unicode(prompt):
        raise VLLMValidationError(
            "prompt is not valid Unicode (it holds a lone surrogate)",
            parameter="prompt",
        )
    bad = "params" if not isinstance(params, Mapping) else _bad_param(params, "")
    for stage_id, entry in per_stage.items():
        bad = bad or _bad_param(entry, f"sampling_params_list.{stage_id}")
    if bad is not None:
        raise VLLMValidationError(
            f"{bad or 'params'} must be a plain value: a string, a 64-bit "
            "integer, a number, a bool, bytes, or lists and mappings of them",
            parameter=bad or "params",
        )
    assert isinstance(params, Mapping)
    readable = _read_by(tuple(stage.kind for stage in route))
    unread = next((key for key in params if key not in readable), None)
    if unread is not None:
        raise VLLMValidationError(
            f"{unread} is not a parameter of any stage this request goes "
            f"through ({', '.join(f'{s.id} ({s.name})' for s in route)})",
            parameter=str(unread),
        )
    for stage in route:
        entry = per_stage.get(stage.id)
        if entry:
            _check_superseded(stage, params, entry)


def _check_superseded(
    stage: StageConfig, params: Mapping[str, Any], entry: Mapping[str, Any]
) -> None:
    """The request's own values that ``entry`` supersedes for ``stage`` are
    still checked as that stage checks them: a value out of its range is the
    client's 400 whether or not an entry replaces it (never silently
    ignored)."""
    replaced = _replaced(params, entry)
    read = stage_params(stage.kind)
    own = {key: params[key] for key in replaced if key in read}
    if own:
        check_stage_params(stage.kind, own)


def _replaced(params: Mapping[str, Any], entry: Mapping[str, Any]) -> set[str]:
    """The request's keys an entry replaces for its stage: a whole
    ``SamplingParams`` every key but ``lora``, else the entry's keys and the
    keys that set the same thing (``_SAME_SETTING``)."""
    if "sampling_params" in entry:
        return {key for key in params if key != "lora"}
    replaced = set(entry).union(*(_SAME_SETTING.get(key, ()) for key in entry))
    return replaced & set(params)


def _bad_param(value: object, path: str, depth: int = 0) -> str | None:
    """The path of the first value that cannot travel to a stage, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value in _INT_RANGE else path
    if isinstance(value, str):
        # The wire's encoder (UTF-8) raises on a lone surrogate.
        return None if is_unicode(value) else path
    if isinstance(value, _PARAM_TYPES):
        return None
    if depth >= 4:
        return path
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            bad = _bad_param(item, f"{path}.{index}" if path else str(index), depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not is_unicode(key):
                return path
            bad = _bad_param(item, f"{path}.{key}" if path else key, depth + 1)
            if bad is not None:
                return bad
        return None
    return path


@functools.cache
def _read_by(kinds: tuple[str, ...]) -> frozenset[str]:
    """The ``params`` keys some stage kind of a route reads."""
    return frozenset().union(*(stage_params(kind) for kind in kinds))


def for_stage(
    params: dict[str, Any], entry: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ``params`` one stage reads: the request's, and over them the
    caller's per-stage entry (``sampling_params_list``), which wins for its
    stage key by key (docs/serving.md, "Per-stage sampling parameters"). A
    whole ``SamplingParams`` entry replaces every sampling key."""
    if not entry:
        return params
    replaced = _replaced(params, entry)
    kept = {key: value for key, value in params.items() if key not in replaced}
    return {**kept, **entry}
