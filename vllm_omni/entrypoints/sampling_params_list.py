"""``sampling_params_list``: one entry of sampling parameters per stage, as
vllm-omni's clients send it (docs/serving.md, "Per-stage sampling parameters").

Owns reading a caller's list into per-stage ``params`` (stage id → mapping):
entry *i* configures the stage with id *i*; each entry is checked as that
stage's parameters (a ``vllm`` stage's through upstream's ``SamplingParams``,
a reference stage's through its own checks, ``Stage.check_params``) before
anything runs, and a mistake is a ``VLLMValidationError`` whose ``parameter``
is its exact place (``sampling_params_list.1.top_k``). How an entry and the
request's own fields combine is the orchestrator's (``_for_stage``). This
module builds no response and catches nothing to restyle it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_omni.config import StageConfig
from vllm_omni.errors import VLLMValidationError
from vllm_omni.stages import check_stage_params, entry_params

__all__ = ["PARAMETER", "form_entries", "per_stage_params"]

PARAMETER = "sampling_params_list"


def per_stage_params(
    stages: Sequence[StageConfig], entries: object
) -> dict[int, dict[str, Any]]:
    """The per-stage ``params`` of ``entries`` (``None``: none), keyed by
    stage id; an entry that is ``None`` or empty leaves its stage's defaults.

    An entry is a mapping of the stage's parameters, or (offline) upstream's
    ``SamplingParams``: for a ``vllm`` stage the object travels whole, for a
    reference stage its fields that differ from upstream's defaults are read
    as a mapping. Raises ``VLLMValidationError`` naming the list, the entry
    or the key.
    """
    if entries is None:
        return {}
    if isinstance(entries, str | bytes | Mapping) or not isinstance(entries, Sequence):
        raise VLLMValidationError(
            f"{PARAMETER} must be a list with one entry per stage", parameter=PARAMETER
        )
    by_id = {stage.id: stage for stage in stages}
    if len(entries) > len(stages):
        raise VLLMValidationError(
            f"{PARAMETER} has {len(entries)} entries; the pipeline has "
            f"{len(stages)} stages",
            parameter=PARAMETER,
        )
    chosen: dict[int, dict[str, Any]] = {}
    for index, entry in enumerate(entries):
        where = f"{PARAMETER}.{index}"
        stage = by_id.get(index)
        if stage is None:
            raise VLLMValidationError(
                f"{where} has no stage: the pipeline has no stage with id {index}",
                parameter=where,
            )
        params = _entry(stage, entry, where)
        if params:
            chosen[stage.id] = params
    return chosen


def form_entries(text: object) -> object:
    """The list a form field carries (image edits, video forms): a form
    field is text, so the list is its JSON text (as vllm-omni's forms carry
    ``lora``); text that is not JSON is a 400 naming the field."""
    try:
        return json.loads(text) if isinstance(text, str) else None
    except (json.JSONDecodeError, RecursionError):
        raise VLLMValidationError(
            f"{PARAMETER} in a form must be JSON text: a list with one entry per stage",
            parameter=PARAMETER,
        ) from None


def _entry(stage: StageConfig, entry: object, where: str) -> dict[str, Any]:
    """One entry as the stage's ``params``, checked."""
    if entry is None:
        return {}
    if _is_sampling_params(entry):
        if stage.kind == "vllm":
            import msgspec

            return {"sampling_params": msgspec.json.encode(entry)}
        entry = _changed_fields(entry)
    if not isinstance(entry, Mapping):
        raise VLLMValidationError(
            f"{where} must be a mapping of stage {stage.id} ({stage.name})'s "
            "sampling parameters, or null",
            parameter=where,
        )
    readable = entry_params(stage.kind)
    for key in entry:
        if key not in readable:
            what = (
                f"stage {stage.id} ({stage.name}) takes no parameters; its "
                "entry must be empty or null"
                if not readable
                else f"it is not a parameter of stage {stage.id} ({stage.name})"
            )
            raise VLLMValidationError(
                f"{where}.{key} cannot be honoured: {what}.",
                parameter=f"{where}.{key}",
            )
    # JSON has one number type: 2.0 is an integer to a JSON schema, and to
    # every parameter here (a float parameter takes an int).
    params = {
        key: int(value) if isinstance(value, float) and value.is_integer() else value
        for key, value in entry.items()
    }
    try:
        check_stage_params(stage.kind, params)
    except VLLMValidationError as exc:
        name = getattr(exc, "parameter", None) or next(iter(params), None)
        message = str(exc.args[0] if exc.args else exc)
        # "max_tokens must be ..." reads "sampling_params_list.1.max_tokens ...".
        joined = "." if name and message.startswith(name) else ": "
        raise VLLMValidationError(
            f"{where}{joined}{message}",
            parameter=f"{where}.{name}" if name else where,
        ) from None
    return params


def _is_sampling_params(entry: object) -> bool:
    """Upstream's ``SamplingParams``, without importing vLLM for a mapping."""
    cls = type(entry)
    return cls.__name__ == "SamplingParams" and cls.__module__.startswith("vllm.")


def _changed_fields(sampling: Any) -> dict[str, Any]:
    """The public fields of a ``SamplingParams`` that differ from upstream's
    defaults: what a caller set, for a stage that reads a mapping."""
    from vllm.sampling_params import SamplingParams

    default = SamplingParams()
    return {
        name: value
        for name in sampling.__struct_fields__
        if not name.startswith("_")
        and (value := getattr(sampling, name)) != getattr(default, name)
    }
