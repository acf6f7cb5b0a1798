"""Narrowing image generations and edits: the image stage's counts, sizes
and seeds, and what an uploaded image may be."""

from __future__ import annotations

from vllm_omni.entrypoints.openai.fields import ROUTES
from vllm_omni.entrypoints.openai.openapi.narrowing import (
    Domains,
    Pipeline,
    entries_domain,
    narrow_fields,
    operation,
    request_body,
)
from vllm_omni.entrypoints.openai.openapi.schema import (
    accepted,
    like,
    nonblank_text,
    sizes,
)
from vllm_omni.entrypoints.openai.protocol import ImageGenerationRequest
from vllm_omni.entrypoints.openai.schema_errors import Schema
from vllm_omni.stages import stage_range
from vllm_omni.stages.ranges import Integers, Sizes

__all__ = ["IMAGE_TYPES", "narrow_image_edits", "narrow_image_generations"]


# What an uploaded image may be: the formats the image stage decodes.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def _image_domains(pipeline: Pipeline, *, form: bool) -> Domains:
    return {
        "model": lambda s: pipeline.model_name(s, form=form),
        "prompt": lambda s: nonblank_text(
            pipeline.limits.max_prompt_chars, "the prompt"
        ),
        **pipeline.of_stage(
            {
                "n": lambda s: accepted(stage_range("image", "n", Integers)),
                "size": lambda s: {
                    **sizes(stage_range("image", "size", Sizes)),
                    "default": s["default"],
                },
                "seed": lambda s: like(
                    s, accepted(stage_range("image", "seed", Integers))
                ),
            }
        ),
        # A form's list is JSON text, checked against the stages by the route.
        **(entries_domain(pipeline) if not form else {}),
    }


def narrow_image_generations(doc: Schema, pipeline: Pipeline) -> None:
    schema = request_body(doc, "image_generations")
    domains = _image_domains(pipeline, form=False)
    narrow_fields(
        schema,
        "image_generations",
        pipeline.stages["image"],
        domains,
        model=ImageGenerationRequest,
    )


def narrow_image_edits(doc: Schema, pipeline: Pipeline) -> None:
    form = "multipart/form-data"
    schema = request_body(doc, "image_edits", form)
    limits = pipeline.limits
    domains = {
        **_image_domains(pipeline, form=True),
        "image": lambda s: {
            **s,
            "description": f"A {', '.join(IMAGE_TYPES)} image of at most "
            f"{limits.max_image_bytes} bytes, {limits.max_image_pixels} pixels "
            f"and {limits.max_image_frames} frames (422 otherwise).",
        },
    }
    narrow_fields(schema, "image_edits", pipeline.stages["image"], domains, form=True)
    schema["additionalProperties"] = False  # any other name is refused (fields.py)
    # FastAPI reads an empty form field as absent: the field's default.
    required = set(schema.get("required", ()))
    properties = schema["properties"]
    rules = ROUTES["image_edits"][0]
    for name, narrowed in properties.items():
        if name not in required:
            # A form field is text, never null: absent is its default.
            if isinstance(narrowed, dict) and "anyOf" in narrowed:
                kept = [s for s in narrowed["anyOf"] if s != {"type": "null"}]
                narrowed = {**narrowed, "anyOf": kept} if kept else narrowed
            empty: Schema = {"const": ""}
            if narrowed is False and name in rules:
                # Refused, and without a default: only the empty field.
                empty["description"] = f"Refused on this pipeline: {rules[name].how}."
            properties[name] = (
                empty if narrowed is False else {"anyOf": [narrowed, empty]}
            )
    properties["sampling_params_list"]["anyOf"][0]["format"] = "json"
    content = operation(doc, "image_edits")["requestBody"]["content"][form]
    content["encoding"] = {"image": {"contentType": ", ".join(IMAGE_TYPES)}}
