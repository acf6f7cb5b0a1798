"""Narrowing ``POST /v1/videos`` (JSON and form bodies): the video stage's
durations and sizes, and vllm-omni 0.30's ``width``/``height``/``fps``/``seed``."""

from __future__ import annotations

from vllm_omni.entrypoints.openai.openapi.narrowing import (
    JSON,
    Domains,
    Pipeline,
    entries_domain,
    narrow_fields,
    request_body,
)
from vllm_omni.entrypoints.openai.openapi.schema import (
    NULL,
    decimal_pattern,
    if_set,
    integers,
    like,
    nonblank_text,
    numbers,
    requires,
    sizes,
)
from vllm_omni.entrypoints.openai.protocol import FORM_TYPES, VIDEO_MAX_PROMPT_CHARS
from vllm_omni.entrypoints.openai.schema_errors import BLANKS, Schema
from vllm_omni.stages import stage_range
from vllm_omni.stages.ranges import Integers, Numbers, Sizes

__all__ = ["narrow_videos"]


def _video_030_domains(pipeline: Pipeline, form: bool) -> Domains:
    """vllm-omni's ``width``, ``height``, ``fps`` and ``seed``: integers in
    the video stage's ranges (a form's as digits)."""
    size = stage_range("video", "size", Sizes)
    fps = stage_range("video", "fps", Integers)
    seed = stage_range("video", "seed", Integers)
    ranges = {
        "width": (size.low, size.high, 4),
        "height": (size.low, size.high, 4),
        "fps": (fps.low, fps.high, 2),
        "seed": (seed.low, seed.high, 10),
    }
    domains: Domains = {}
    for name, (first, last, digits) in ranges.items():
        step = {"multipleOf": size.step} if name in ("width", "height") else {}
        if form:
            pattern = decimal_pattern(first, last, int_digits=digits, frac_digits=0)
            what = f"an integer from {first} to {last}"
            if step:
                # The multiples, spelled out (a regex cannot count).
                sides = "|".join(
                    str(side) for side in range(first, last + 1, size.step)
                )
                pattern = f"^{BLANKS}0{{0,{digits - 1}}}(?:{sides}){BLANKS}$"
                what += f", a multiple of {size.step}"
            text = {"type": "string", "pattern": pattern, "description": what}
            domains[name] = lambda s, text=text: text
        else:
            number = {**integers(first, last), **step}
            domains[name] = lambda s, number=number: like(s, number)
    return domains


def narrow_videos(doc: Schema, pipeline: Pipeline) -> None:
    seconds = stage_range("video", "seconds", Numbers)
    low, high = seconds.low, seconds.high
    seconds_text = {
        "type": "string",
        "pattern": decimal_pattern(low, high, int_digits=4, frac_digits=3),
        "description": f"a number of seconds from {low:g} to {high:g}, e.g. '4'",
    }
    # The route reads a lower-case "x" only (the stage also an "X").
    size = sizes(stage_range("video", "size", Sizes), times="x")
    for media_type in (JSON, *FORM_TYPES):
        form = media_type != JSON
        domains: Domains = {
            "model": lambda s, form=form: pipeline.model_name(s, form=form),
            "prompt": lambda s: nonblank_text(VIDEO_MAX_PROMPT_CHARS, "the prompt"),
            "seconds": lambda s, form=form: (
                seconds_text
                if form
                else {"anyOf": [numbers(low, high), seconds_text, NULL]}
            ),
            "size": lambda s, form=form: size if form else like(s, size),
            **pipeline.of_stage(_video_030_domains(pipeline, form)),
            **(entries_domain(pipeline) if not form else {}),
        }
        schema = request_body(doc, "videos", media_type)
        narrow_fields(schema, "videos", pipeline.stages["video"], domains, form=form)
        # width and height go together, and not with size.
        given = {"type": "string"} if form else {"type": ["integer", "number"]}
        absent = (
            {"not": {"required": ["size"]}} if form else {"properties": {"size": NULL}}
        )
        schema["allOf"] = [
            if_set("width", given, {"allOf": [requires("height", given), absent]}),
            if_set("height", given, requires("width", given)),
        ]
        if form:
            # JSON text: drawn as such by the fuzz (``format``).
            schema["properties"]["sampling_params_list"]["format"] = "json"
