"""Narrowing a route's request schema to a pipeline: what the narrowing
reads of the engine (``Pipeline``), each field honoured with its domain or
refused (``narrow_fields``), and the per-stage ``sampling_params_list``.

Who honours a field is ``fields.py``'s table; this module applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_omni.entrypoints.openai.fields import ROUTE, ROUTES
from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.entrypoints.openai.openapi.schema import (
    NULL,
    accepted,
    like,
    only_default,
)
from vllm_omni.entrypoints.openai.schema_errors import Schema
from vllm_omni.stages import stage_ranges

if TYPE_CHECKING:
    from pydantic import BaseModel

    from vllm_omni.config import StageConfig

__all__ = [
    "JSON",
    "Domains",
    "Pipeline",
    "component",
    "entries_domain",
    "narrow_fields",
    "operation",
    "request_body",
    "route_path",
]

JSON = "application/json"


# -- the pipeline ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What the narrowing reads from the engine. ``stage_domains`` is false
    for the schemas ``check_body`` holds a request to before its stages run:
    a stage checks its own domain (its 400 names the stage), the route the
    rest (types, route rules); the document states both."""

    model: str
    stages: dict[str, StageConfig | None]
    limits: RequestLimits
    stage_domains: bool = True
    # Every stage, for the per-stage ``sampling_params_list``.
    all_stages: tuple[StageConfig, ...] = ()

    def of_stage(self, domains: Domains) -> Domains:
        return domains if self.stage_domains else {}

    def kind(self, modality: str) -> str | None:
        stage = self.stages.get(modality)
        return stage.kind if stage is not None else None

    def model_name(self, original: Schema, *, form: bool) -> Schema:
        served = {
            "type": "string",
            "const": self.model,
            "description": "the served model",
        }
        return served if form else like(original, served)


Domains = dict[str, Callable[[Schema], Schema]]


def narrow_fields(
    schema: Schema,
    route: str,
    stage: StageConfig | None,
    domains: Domains,
    *,
    model: type[BaseModel] | None = None,
    form: bool = False,
) -> None:
    """Each field of ``route`` in ``schema`` (the JSON schema of ``model``,
    when it has one): honoured, with its domain; or refused, and then its
    default only."""
    table = ROUTES[route][0]
    fields = model.model_fields if model is not None else {}
    properties: dict[str, Any] = schema["properties"]
    for name, original in list(properties.items()):
        rule = table.get(name)
        honoured = rule is not None and (
            ROUTE in rule.honoured_by
            or (stage is not None and stage.kind in rule.honoured_by)
        )
        if honoured:
            if name in domains:
                properties[name] = domains[name](original)
            continue
        if rule is None:
            reason = "it is not supported by this server"
        elif rule.honoured_by and stage is not None:
            reason = f"it is not supported by stage {stage.id} ({stage.name})"
        else:
            reason = rule.how
        properties[name] = only_default(original, fields.get(name), reason, form=form)


def component(doc: Schema, schema: Schema) -> Schema:
    """The component a ``$ref`` names, or the schema itself."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]  # type: ignore[no-any-return]


def route_path(route: str) -> str:
    return ROUTES[route][1].split(" ", 1)[1]


def operation(doc: Schema, route: str) -> Schema:
    method = ROUTES[route][1].split(" ", 1)[0].lower()
    return doc["paths"][route_path(route)][method]  # type: ignore[no-any-return]


def request_body(doc: Schema, route: str, media_type: str = JSON) -> Schema:
    content = operation(doc, route)["requestBody"]["content"]
    return component(doc, content[media_type]["schema"])


def _entry_keys(kind: str) -> dict[str, Schema] | None:
    """The keys (with their domains) a stage's entry of
    ``sampling_params_list`` may set; ``None`` for a ``vllm`` stage, whose
    keys upstream's ``SamplingParams`` checks."""
    ranges = stage_ranges(kind)
    if ranges is None:
        return None
    return {name: accepted(value) for name, value in ranges.items()}


def entries_domain(pipeline: Pipeline) -> Domains:
    """``sampling_params_list``: entry i the parameters of stage i, each with
    its domain (docs/serving.md, "Per-stage sampling parameters"). The
    schema ``check_body`` holds a request to keeps the list's own type only:
    the entries are checked against their stages, which name the key."""
    if not pipeline.stage_domains or not pipeline.all_stages:
        return {}
    by_id = {stage.id: stage for stage in pipeline.all_stages}
    entries: list[Schema | bool] = []
    for index in range(len(pipeline.all_stages)):
        stage = by_id.get(index)
        if stage is None:
            entries.append(False)
            continue
        keys = _entry_keys(stage.kind)
        entry: Schema = {"type": "object"}
        if keys is not None:
            entry.update(properties=keys, additionalProperties=False)
        entries.append(
            {
                "anyOf": [entry, NULL],
                "description": f"stage {stage.id} ({stage.name}, {stage.kind})",
            }
        )
    array = {"type": "array", "prefixItems": entries, "items": False}
    return {
        "sampling_params_list": lambda s: {
            **like(s, array),
            "description": s.get("description", ""),
        }
    }
