"""The served document and the schemas request bodies are checked against,
built once per engine: FastAPI's document, each route narrowed twice (with
and without the stages' own domains), and the error event's schemas."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.entrypoints.openai.openapi.chat import narrow_chat, narrow_completions
from vllm_omni.entrypoints.openai.openapi.images import (
    narrow_image_edits,
    narrow_image_generations,
)
from vllm_omni.entrypoints.openai.openapi.narrowing import (
    JSON,
    Pipeline,
    operation,
    route_path,
)
from vllm_omni.entrypoints.openai.openapi.speech import narrow_speech
from vllm_omni.entrypoints.openai.openapi.videos import narrow_videos
from vllm_omni.entrypoints.openai.protocol import FORM_TYPES
from vllm_omni.entrypoints.openai.schema_errors import Schema
from vllm_omni.errors.http.schema import component_schemas

if TYPE_CHECKING:
    from fastapi import FastAPI

    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = ["Served", "narrowed"]


_NARROW: dict[str, Callable[[Schema, Pipeline], None]] = {
    "chat": narrow_chat,
    "completions": narrow_completions,
    "speech": narrow_speech,
    "image_generations": narrow_image_generations,
    "image_edits": narrow_image_edits,
    "videos": narrow_videos,
}
# The bodies ``check_body`` holds to the document (a multipart image edit is
# read by FastAPI's typed form fields, checked by the route and the stage).
_CHECKED: tuple[tuple[str, str], ...] = (
    ("chat", JSON),
    ("completions", JSON),
    ("speech", JSON),
    ("image_generations", JSON),
    ("videos", JSON),
    *(("videos", media_type) for media_type in FORM_TYPES),
)


@dataclass(frozen=True, slots=True)
class Served:
    engine: AsyncOmni
    document: Schema
    validators: dict[tuple[str, str], jsonschema_rs.Validator]
    # The schema each validator checks (errors name their place in it).
    roots: dict[tuple[str, str], Schema]
    # Pattern → what it means, for messages.
    formats: dict[str, str]


def narrowed(app: FastAPI, engine: AsyncOmni) -> Served:
    generated = app.__class__.openapi(app)
    pipeline = Pipeline(
        model=engine.model_name,
        stages={m: engine.stage_for(m) for m in ("text", "audio", "image", "video")},
        limits=getattr(app.state, "limits", None) or RequestLimits(),
        all_stages=tuple(getattr(getattr(engine, "config", None), "stages", ())),
    )
    routes = [r for r in _NARROW if route_path(r) in generated["paths"]]
    document = copy.deepcopy(generated)
    # The error event (SSE, WebSocket, jobs) beside the HTTP envelope the
    # routes' responses name (no route's schema can reference an SSE event),
    # both as one generator writes them.
    document["components"]["schemas"].update(component_schemas())
    checked = copy.deepcopy(generated)
    for route in routes:
        _NARROW[route](document, pipeline)
        # A video job's stage runs after the 200: its route checks it all.
        stage_domains = route == "videos"
        _NARROW[route](checked, replace(pipeline, stage_domains=stage_domains))
    validators = {}
    roots = {}
    for route, media_type in _CHECKED:
        if route not in routes:
            continue
        body = operation(checked, route)["requestBody"]["content"][media_type]
        root = {**body["schema"], "components": checked["components"]}
        validators[route, media_type] = jsonschema_rs.Draft202012Validator(root)
        roots[route, media_type] = root
    return Served(engine, document, validators, roots, _formats(document))


def _formats(document: Schema) -> dict[str, str]:
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str) and "description" in node:
                found[node["pattern"]] = node["description"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return found
