"""The served ``/openapi.json``, narrowed to the running pipeline, and the
check that holds every JSON and form request to it (docs/design.md §10).

FastAPI describes each route's request model (upstream's for chat and
completions); ``served`` narrows that document, once per engine, with the
data the server enforces, so a client generated from it builds only requests
the server honours:

- ``fields.py``: a field that no stage of this pipeline honours may only
  take its default (or null, where the model admits it);
- the pipeline: the kind of the stage that does each route's work
  (``engine.stage_for``), the served model name, whether a talker exists;
- the domains the reference stages enforce, read from their constants
  (``vllm_omni.stages.*``: token, choice, stop, temperature, seed, size,
  count, speed, duration ranges, voices), the request limits and the
  route's own rules (roles, text-only content, one prompt, cross-field
  rules such as ``stream_options`` needing ``stream``);
- a ``vllm`` stage keeps upstream's schema for what upstream validates.

``check_body`` validates a request body with the same schema (the
``jsonschema_rs`` validator, the ECMA-262 dialect the document is written
in), so what the document does not admit is a 400 naming the field before
any stage runs: a string for a number or a number for a boolean (which
pydantic's lax mode would coerce), a value outside a stage's domain, a chat
message without text on a reference text stage. Routes call it after their
own checks, whose messages are more specific.

Not expressible in JSON Schema, and documented instead: the joined length
of a chat's messages (``--max-prompt-chars``), the body size (413), the
content guardrail, an uploaded image's decodability, pixels and frames
(422; the document names the image types). This module decides nothing
about what is honoured (``fields.py`` does) and builds no responses; it reads
the request models from ``protocol.py`` and words a 400 with
``schema_errors.py``, and imports no route or serving module.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jsonschema_rs
from starlette.requests import Request
from starlette.responses import JSONResponse

from vllm_omni.entrypoints.openai.fields import ROUTE, ROUTES
from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.entrypoints.openai.protocol import (
    EMPTY_TOOLS_ARE_NO_TOOLS,
    FORM_TYPES,
    ROLES,
    VIDEO_MAX_PROMPT_CHARS,
    ChatCompletionRequest,
    CompletionRequest,
    ImageGenerationRequest,
    SpeechRequest,
)
from vllm_omni.entrypoints.openai.schema_errors import (
    BLANKS,
    NOT_BLANK,
    Schema,
    first_error,
)
from vllm_omni.errors.http.schema import component_schemas
from vllm_omni.stages import image as image_stage
from vllm_omni.stages import text as text_stage
from vllm_omni.stages import video as video_stage
from vllm_omni.stages.base import SIZE_STEP
from vllm_omni.stages.speech import SPEED_RANGE, VOICES

if TYPE_CHECKING:
    from fastapi import FastAPI
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo
    from starlette.requests import HTTPConnection

    from vllm_omni.config import StageConfig
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = [
    "IMAGE_TYPES",
    "check_body",
    "decimal_pattern",
    "prepare",
    "served",
    "size_pattern",
]

# What an uploaded image may be: the formats the image stage decodes.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_JSON = "application/json"


# -- patterns of the stages' grammars ---------------------------------------------


def _fixed_width(low: str, high: str) -> list[list[str]]:
    """Regex digit classes, one list per alternative, matching exactly the
    digit strings of this width from ``low`` to ``high``."""
    if not low:
        return [[]]
    if low[0] == high[0]:
        return [[low[0], *rest] for rest in _fixed_width(low[1:], high[1:])]
    width = len(low) - 1
    first, last = int(low[0]), int(high[0])
    lower: list[list[str]] = []
    upper: list[list[str]] = []
    if low[1:] != "0" * width:
        lower = [[low[0], *rest] for rest in _fixed_width(low[1:], "9" * width)]
        first += 1
    if high[1:] != "9" * width:
        upper = [[high[0], *rest] for rest in _fixed_width("0" * width, high[1:])]
        last -= 1
    middle = []
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        middle = [[digit, *["[0-9]"] * width]]
    return lower + middle + upper


def _integers(low: int, high: int) -> list[list[str]]:
    """Digit classes of the integers from ``low`` to ``high`` (no sign, no
    leading zero)."""
    alternatives: list[list[str]] = []
    for width in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (width - 1) if width > 1 else 0)
        last = min(high, 10**width - 1)
        if first <= last:
            alternatives += _fixed_width(str(first), str(last))
    return alternatives


def decimal_pattern(
    low: float, high: float, *, int_digits: int, frac_digits: int
) -> str:
    """A regex of the decimals ``I[.F]`` from ``low`` to ``high``: ``I`` of 1
    to ``int_digits`` digits (leading zeros allowed), ``F`` of 1 to
    ``frac_digits``, surrounded by blanks (``str.strip`` removes them)."""
    alternatives = []
    for places in range(frac_digits + 1):
        scale = 10**places
        first = math.ceil(round(low * scale, 9))
        last = math.floor(round(high * scale, 9))
        for digits in _integers(first, last):
            # At least one integer digit: 5 hundredths is 0.05.
            digits = ["0"] * max(0, places + 1 - len(digits)) + digits
            head = digits[: len(digits) - places]
            tail = digits[len(digits) - places :]
            spare = int_digits - len(head)
            if spare < 0:
                continue
            zeros = f"0{{0,{spare}}}" if spare else ""
            fraction = r"\." + "".join(tail) if places else ""
            alternatives.append(zeros + "".join(head) + fraction)
    return f"^{BLANKS}(?:{'|'.join(alternatives)}){BLANKS}$"


def size_pattern(low: int, high: int, *, digits: int = 5, times: str = "xX") -> str:
    """A regex of the sizes ``parse_size`` accepts: ``WxH`` (the ``x`` one of
    ``times``), each side from ``low`` to ``high`` and a multiple of
    ``SIZE_STEP``, written with at most ``digits`` digits (leading zeros
    allowed)."""
    by_width: dict[int, list[str]] = {}
    for side in range(-(-low // SIZE_STEP) * SIZE_STEP, high + 1, SIZE_STEP):
        by_width.setdefault(len(str(side)), []).append(str(side))
    side = "|".join(
        f"0{{0,{digits - width}}}(?:{'|'.join(sides)})"
        for width, sides in by_width.items()
    )
    return f"^(?:{side})[{times}](?:{side})$"


# -- schema pieces -----------------------------------------------------------------

NULL: Schema = {"type": "null"}


def _integer(low: int, high: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


def _number(low: float, high: float) -> Schema:
    return {"type": "number", "minimum": low, "maximum": high}


def _text(max_length: int, what: str) -> Schema:
    return {
        "type": "string",
        **NOT_BLANK,
        "maxLength": max_length,
        "description": f"{what}: not blank, at most {max_length} characters",
    }


def _size(low: int, high: int, times: str = "xX") -> Schema:
    return {
        "type": "string",
        "pattern": size_pattern(low, high, times=times),
        "description": f"WxH, each side from {low} to {high} and a multiple of "
        f"{SIZE_STEP}",
    }


def _admits_null(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return schema is True
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(
        _admits_null(branch)
        for keyword in ("anyOf", "oneOf")
        for branch in schema.get(keyword, ())
    )


def _like(original: Schema, domain: Schema) -> Schema:
    """``domain``, or null where the model admits null (the field's default)."""
    if not _admits_null(original):
        return domain
    return {"anyOf": [domain, NULL]}


def _default(original: Schema, field: FieldInfo | None) -> list[Any]:
    """The field's default, if it has one the client can send (a factory's
    counts when it is the same every time: ``[]``, not a fresh id)."""
    if field is not None and field.default_factory is not None:
        first = field.get_default(call_default_factory=True)
        same = first == field.get_default(call_default_factory=True)
        return [first] if same and first is not None else []
    default = original.get("default")
    return [] if default is None else [default]


def _only_default(
    original: Schema, field: FieldInfo | None, reason: str, *, form: bool
) -> Schema | bool:
    """A refused field: its default, or null where the model admits it; a
    field without either may not be sent at all (``false``)."""
    values: list[Any] = []
    if _admits_null(original) and not form:
        values.append(None)
    values += _default(original, field)
    if not values:
        return False
    return {"enum": values, "description": f"Refused on this pipeline: {reason}."}


# -- the pipeline ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pipeline:
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
        return served if form else _like(original, served)


Domains = dict[str, Callable[[Schema], Schema]]


def _narrow_fields(
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
        properties[name] = _only_default(original, fields.get(name), reason, form=form)


def _component(doc: Schema, schema: Schema) -> Schema:
    """The component a ``$ref`` names, or the schema itself."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]  # type: ignore[no-any-return]


def _path(route: str) -> str:
    return ROUTES[route][1].split(" ", 1)[1]


def _operation(doc: Schema, route: str) -> Schema:
    method = ROUTES[route][1].split(" ", 1)[0].lower()
    return doc["paths"][_path(route)][method]  # type: ignore[no-any-return]


def _body(doc: Schema, route: str, media_type: str = _JSON) -> Schema:
    content = _operation(doc, route)["requestBody"]["content"]
    return _component(doc, content[media_type]["schema"])


# -- chat and completions -------------------------------------------------------------


def _stop(original: Schema) -> Schema:
    # An empty string or list is no stop at all (the route drops it).
    return _like(
        original,
        {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "maxItems": text_stage.MAX_STOP,
                },
            ]
        },
    )


def _text_domains(pipeline: _Pipeline, kind: str | None) -> Domains:
    """The sampling fields the reference text stage checks (a ``vllm`` stage:
    upstream's schema)."""
    if kind != "text":
        return {}
    tokens = _integer(1, text_stage.MAX_TOKENS_LIMIT)
    return pipeline.of_stage(
        {
            "max_tokens": lambda s: _like(s, tokens),
            "max_completion_tokens": lambda s: _like(s, tokens),
            "temperature": lambda s: _like(s, _number(*text_stage.TEMPERATURE_RANGE)),
            "seed": lambda s: _like(s, _integer(*text_stage.SEED_RANGE)),
            "stop": _stop,
            "n": lambda s: _like(s, _integer(1, text_stage.MAX_CHOICES)),
        }
    )


def _stream_options(original: Schema) -> Schema:
    return _like(
        original,
        {
            "type": "object",
            "properties": {
                "include_usage": {"type": ["boolean", "null"]},
                "continuous_usage_stats": {
                    "enum": [False, None],
                    "description": "not supported; use include_usage",
                },
            },
        },
    )


def _generation_domains(pipeline: _Pipeline, kind: str | None) -> Domains:
    return {
        "model": lambda s: pipeline.model_name(s, form=False),
        "stream_options": _stream_options,
        **_text_domains(pipeline, kind),
        **_entries_domain(pipeline),
    }


def _entry_keys(kind: str) -> dict[str, Schema] | None:
    """The keys (with their domains) a reference stage's entry of
    ``sampling_params_list`` may set; ``None`` for a ``vllm`` stage, whose
    keys upstream's ``SamplingParams`` checks."""
    tokens = _integer(1, text_stage.MAX_TOKENS_LIMIT)
    seed = _integer(*image_stage.SEED_RANGE)
    non_empty = {"type": "string", "minLength": 1}
    keys: dict[str, dict[str, Schema]] = {
        "text": {
            "max_tokens": tokens,
            "max_completion_tokens": tokens,
            "temperature": _number(*text_stage.TEMPERATURE_RANGE),
            "seed": _integer(*text_stage.SEED_RANGE),
            "stop": {
                "anyOf": [
                    non_empty,
                    {
                        "type": "array",
                        "items": non_empty,
                        "maxItems": text_stage.MAX_STOP,
                    },
                ]
            },
            "n": _integer(1, text_stage.MAX_CHOICES),
        },
        "talker": {
            "voice": {"enum": sorted(VOICES)},
            "speed": _number(*SPEED_RANGE),
        },
        "image": {
            "n": _integer(1, image_stage.MAX_IMAGES),
            "size": _size(*image_stage.SIZE_RANGE),
            "seed": seed,
        },
        "video": {
            "seconds": _number(*video_stage.SECONDS_RANGE),
            "size": _size(*video_stage.SIZE_RANGE),
            "fps": _integer(1, 30),
            "seed": seed,
        },
    }
    return None if kind == "vllm" else keys.get(kind, {})


def _entries_domain(pipeline: _Pipeline) -> Domains:
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
            **_like(s, array),
            "description": s.get("description", ""),
        }
    }


def _if_set(name: str, value: Schema, then: Schema) -> Schema:
    """``then`` applies when the request sets ``name`` to a ``value``."""
    return {
        "if": {"required": [name], "properties": {name: value}},
        "then": then,
    }


def _requires(name: str, value: Schema) -> Schema:
    return {"required": [name], "properties": {name: value}}


_STREAM_OPTIONS_NEED_STREAM = _if_set(
    "stream_options",
    {"type": "object", "minProperties": 1},
    _requires("stream", {"const": True}),
)


def _messages_text(pipeline: _Pipeline) -> Schema:
    """A reference text stage reads text only: each message is a role and
    non-blank text (a string, or text parts), optionally a name."""
    text = _text(pipeline.limits.max_prompt_chars, "text")
    part = {
        "type": "object",
        "required": ["type", "text"],
        "additionalProperties": False,
        "properties": {"type": {"const": "text"}, "text": text},
    }
    return {
        "type": "array",
        "minItems": 1,
        "description": "Each message has non-blank text; the text of all "
        f"messages, joined, is at most {pipeline.limits.max_prompt_chars} "
        "characters.",
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "additionalProperties": False,
            "properties": {
                "role": {"type": "string", "enum": list(ROLES)},
                "content": {
                    "anyOf": [
                        text,
                        {"type": "array", "minItems": 1, "items": part},
                    ]
                },
                "name": {"type": "string"},
            },
        },
    }


def _messages_vllm(doc: Schema, original: Schema) -> Schema:
    """Upstream's messages, with the roles of the OpenAI API, at least one of
    them carrying non-blank text (the route reads it)."""
    schemas = doc["components"]["schemas"]
    for component in schemas.values():
        role = component.get("properties", {}).get("role")
        if role == {"type": "string", "title": "Role"}:
            component["properties"]["role"] = {"type": "string", "enum": list(ROLES)}
    nonblank = {"type": "string", **NOT_BLANK}
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": nonblank},
    }
    with_text = {
        "type": "object",
        "required": ["content"],
        "properties": {
            "content": {"anyOf": [nonblank, {"type": "array", "contains": text_part}]}
        },
    }
    return {**original, "minItems": 1, "contains": with_text}


def _narrow_chat(doc: Schema, pipeline: _Pipeline) -> None:
    schema = _body(doc, "chat")
    stage = pipeline.stages["text"]
    kind = pipeline.kind("text")
    talker = pipeline.kind("audio") == "talker"
    modalities = ["text", "audio"] if pipeline.stages.get("audio") else ["text"]
    audio_options = {
        "type": "object",
        "properties": {
            "voice": {"type": "string", "enum": sorted(VOICES)}
            if talker
            else {"type": "string"},
            "format": {"const": "wav"},
        },
    }
    domains: Domains = {
        **_generation_domains(pipeline, kind),
        "messages": (
            (lambda s: _messages_vllm(doc, s))
            if kind == "vllm"
            else (lambda s: _messages_text(pipeline))
        ),
        # Text, or text and audio: without text no text stage runs.
        "modalities": lambda s: _like(
            s,
            {
                "type": "array",
                "items": {"enum": modalities},
                "if": {"minItems": 1},
                "then": {"contains": {"const": "text"}},
            },
        ),
        "audio": lambda s: _like(s, audio_options),
        "voice": lambda s: _like(s, audio_options["properties"]["voice"]),
        "speaker": lambda s: _like(s, audio_options["properties"]["voice"]),
        # Nothing is read from a nested extra_body: only empty (or nulls).
        "extra_body": lambda s: _like(
            s, {"type": "object", "additionalProperties": NULL}
        ),
    }
    if kind == "vllm":
        # No tool parser runs: tool_choice none only, which tools must name
        # (upstream makes it "auto" when tools come without it).
        domains["tool_choice"] = lambda s: {"enum": ["none", None]}
        # An empty list is no tools where upstream reads it so (0.34), a 400
        # where it refuses it (0.33).
        least = 0 if EMPTY_TOOLS_ARE_NO_TOOLS else 1
        domains["tools"] = lambda s: _like(s, {**s["anyOf"][0], "minItems": least})
    _narrow_fields(schema, "chat", stage, domains, model=ChatCompletionRequest)
    tools = schema["properties"]["tools"]
    if EMPTY_TOOLS_ARE_NO_TOOLS and "enum" in tools:
        tools["enum"].append([])  # refused, but an empty list is no tools
    with_audio = {"type": "array", "contains": {"const": "audio"}}
    rules = [
        _STREAM_OPTIONS_NEED_STREAM,
        *(
            _if_set(name, value, _requires("modalities", with_audio))
            for name, value in (
                ("audio", {"type": "object"}),
                ("voice", {"type": "string"}),
                ("speaker", {"type": "string"}),
            )
        ),
        _if_set("modalities", with_audio, {"properties": {"n": {"enum": [1, None]}}}),
    ]
    # The voice is given once: audio.voice, voice or speaker.
    no_audio_voice = {"anyOf": [NULL, {"properties": {"voice": False}}]}
    string = {"type": "string"}
    rules += [
        _if_set("voice", string, {"properties": {"speaker": NULL}}),
        *(
            _if_set(name, string, {"properties": {"audio": no_audio_voice}})
            for name in ("voice", "speaker")
        ),
    ]
    if kind == "vllm":
        rules.append(
            _if_set(
                "tools", {"type": "array", "minItems": 1}, {"required": ["tool_choice"]}
            )
        )
    schema["allOf"] = rules


def _narrow_completions(doc: Schema, pipeline: _Pipeline) -> None:
    schema = _body(doc, "completions")
    prompt = _text(pipeline.limits.max_prompt_chars, "the prompt")
    domains: Domains = {
        **_generation_domains(pipeline, pipeline.kind("text")),
        "prompt": lambda s: {
            "anyOf": [
                prompt,
                {"type": "array", "items": prompt, "minItems": 1, "maxItems": 1},
            ],
            "description": "one prompt (batched and token-id prompts are not "
            "supported)",
        },
    }
    _narrow_fields(
        schema,
        "completions",
        pipeline.stages["text"],
        domains,
        model=CompletionRequest,
    )
    schema["required"] = sorted({*schema.get("required", ()), "prompt"})
    schema["allOf"] = [_STREAM_OPTIONS_NEED_STREAM]


# -- speech, images, videos -----------------------------------------------------------


def _narrow_speech(doc: Schema, pipeline: _Pipeline) -> None:
    schema = _body(doc, "speech")
    domains: Domains = {
        "model": lambda s: pipeline.model_name(s, form=False),
        "input": lambda s: {**s, **NOT_BLANK},
        **pipeline.of_stage(
            {
                "voice": lambda s: {**s, "enum": sorted(VOICES)},
                "speed": lambda s: _like(s, _number(*SPEED_RANGE)),
            }
        ),
        **_entries_domain(pipeline),
    }
    _narrow_fields(
        schema, "speech", pipeline.stages["audio"], domains, model=SpeechRequest
    )


def _image_domains(pipeline: _Pipeline, *, form: bool) -> Domains:
    return {
        "model": lambda s: pipeline.model_name(s, form=form),
        "prompt": lambda s: _text(pipeline.limits.max_prompt_chars, "the prompt"),
        **pipeline.of_stage(
            {
                "n": lambda s: _integer(1, image_stage.MAX_IMAGES),
                "size": lambda s: {
                    **_size(*image_stage.SIZE_RANGE),
                    "default": s["default"],
                },
                "seed": lambda s: _like(s, _integer(*image_stage.SEED_RANGE)),
            }
        ),
        # A form's list is JSON text, checked against the stages by the route.
        **(_entries_domain(pipeline) if not form else {}),
    }


def _narrow_image_generations(doc: Schema, pipeline: _Pipeline) -> None:
    schema = _body(doc, "image_generations")
    domains = _image_domains(pipeline, form=False)
    _narrow_fields(
        schema,
        "image_generations",
        pipeline.stages["image"],
        domains,
        model=ImageGenerationRequest,
    )


def _narrow_image_edits(doc: Schema, pipeline: _Pipeline) -> None:
    form = "multipart/form-data"
    schema = _body(doc, "image_edits", form)
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
    _narrow_fields(schema, "image_edits", pipeline.stages["image"], domains, form=True)
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
    content = _operation(doc, "image_edits")["requestBody"]["content"][form]
    content["encoding"] = {"image": {"contentType": ", ".join(IMAGE_TYPES)}}


def _video_030_domains(pipeline: _Pipeline, form: bool) -> Domains:
    """vllm-omni's ``width``, ``height``, ``fps`` and ``seed``: integers in
    the video stage's ranges (a form's as digits)."""
    low, high = video_stage.SIZE_RANGE
    ranges = {
        "width": (low, high, 4),
        "height": (low, high, 4),
        "fps": (*video_stage.FPS_RANGE, 2),
        "seed": (*image_stage.SEED_RANGE, 10),
    }
    domains: Domains = {}
    for name, (first, last, digits) in ranges.items():
        step = {"multipleOf": SIZE_STEP} if name in ("width", "height") else {}
        if form:
            pattern = decimal_pattern(first, last, int_digits=digits, frac_digits=0)
            what = f"an integer from {first} to {last}"
            if step:
                # The multiples, spelled out (a regex cannot count).
                sides = "|".join(
                    str(side) for side in range(first, last + 1, SIZE_STEP)
                )
                pattern = f"^{BLANKS}0{{0,{digits - 1}}}(?:{sides}){BLANKS}$"
                what += f", a multiple of {SIZE_STEP}"
            text = {"type": "string", "pattern": pattern, "description": what}
            domains[name] = lambda s, text=text: text
        else:
            number = {**_integer(first, last), **step}
            domains[name] = lambda s, number=number: _like(s, number)
    return domains


def _narrow_videos(doc: Schema, pipeline: _Pipeline) -> None:
    low, high = video_stage.SECONDS_RANGE
    seconds_text = {
        "type": "string",
        "pattern": decimal_pattern(low, high, int_digits=4, frac_digits=3),
        "description": f"a number of seconds from {low:g} to {high:g}, e.g. '4'",
    }
    # The route reads a lower-case "x" only (the stage also an "X").
    size = _size(*video_stage.SIZE_RANGE, times="x")
    for media_type in (_JSON, *FORM_TYPES):
        form = media_type != _JSON
        domains: Domains = {
            "model": lambda s, form=form: pipeline.model_name(s, form=form),
            "prompt": lambda s: _text(VIDEO_MAX_PROMPT_CHARS, "the prompt"),
            "seconds": lambda s, form=form: (
                seconds_text
                if form
                else {"anyOf": [_number(low, high), seconds_text, NULL]}
            ),
            "size": lambda s, form=form: size if form else _like(s, size),
            **pipeline.of_stage(_video_030_domains(pipeline, form)),
            **(_entries_domain(pipeline) if not form else {}),
        }
        schema = _body(doc, "videos", media_type)
        _narrow_fields(schema, "videos", pipeline.stages["video"], domains, form=form)
        # width and height go together, and not with size.
        given = {"type": "string"} if form else {"type": ["integer", "number"]}
        absent = (
            {"not": {"required": ["size"]}} if form else {"properties": {"size": NULL}}
        )
        schema["allOf"] = [
            _if_set("width", given, {"allOf": [_requires("height", given), absent]}),
            _if_set("height", given, _requires("width", given)),
        ]
        if form:
            # JSON text: drawn as such by the fuzz (``format``).
            schema["properties"]["sampling_params_list"]["format"] = "json"


_NARROW: dict[str, Callable[[Schema, _Pipeline], None]] = {
    "chat": _narrow_chat,
    "completions": _narrow_completions,
    "speech": _narrow_speech,
    "image_generations": _narrow_image_generations,
    "image_edits": _narrow_image_edits,
    "videos": _narrow_videos,
}
# The bodies ``check_body`` holds to the document (a multipart image edit is
# read by FastAPI's typed form fields, checked by the route and the stage).
_CHECKED: tuple[tuple[str, str], ...] = (
    ("chat", _JSON),
    ("completions", _JSON),
    ("speech", _JSON),
    ("image_generations", _JSON),
    ("videos", _JSON),
    *(("videos", media_type) for media_type in FORM_TYPES),
)


# -- serving and checking -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Served:
    engine: AsyncOmni
    document: Schema
    validators: dict[tuple[str, str], jsonschema_rs.Validator]
    # The schema each validator checks (errors name their place in it).
    roots: dict[tuple[str, str], Schema]
    # Pattern → what it means, for messages.
    formats: dict[str, str]


def _narrowed(app: FastAPI, engine: AsyncOmni) -> _Served:
    generated = app.__class__.openapi(app)
    pipeline = _Pipeline(
        model=engine.model_name,
        stages={m: engine.stage_for(m) for m in ("text", "audio", "image", "video")},
        limits=getattr(app.state, "limits", None) or RequestLimits(),
        all_stages=tuple(getattr(getattr(engine, "config", None), "stages", ())),
    )
    routes = [r for r in _NARROW if _path(r) in generated["paths"]]
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
        body = _operation(checked, route)["requestBody"]["content"][media_type]
        root = {**body["schema"], "components": checked["components"]}
        validators[route, media_type] = jsonschema_rs.Draft202012Validator(root)
        roots[route, media_type] = root
    return _Served(engine, document, validators, roots, _formats(document))


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


def prepare(app: FastAPI) -> None:
    """Narrow the document for the app's engine in a worker thread, started
    by ``init_app_state``: FastAPI's own document of upstream's request
    models takes ~0.4 s, which the server need not wait for before
    ``/health``; a request that needs it first awaits it (``check_body``)."""
    engine = app.state.engine_client
    app.state.openapi_task = asyncio.get_running_loop().create_task(
        asyncio.to_thread(_narrowed, app, engine)
    )


def _served(app: FastAPI) -> _Served | None:
    """The narrowed document of the app's engine: the one ``prepare`` built,
    or built now (an engine attached without ``init_app_state``, or a
    ``/openapi.json`` before the thread is done)."""
    engine: AsyncOmni | None = getattr(app.state, "engine_client", None)
    if engine is None:
        return None
    task: asyncio.Task[_Served] | None = getattr(app.state, "openapi_task", None)
    if task is not None and task.done() and task.result().engine is engine:
        return task.result()
    current: _Served | None = getattr(app.state, "openapi_served", None)
    if current is None or current.engine is not engine:
        current = _narrowed(app, engine)
        app.state.openapi_served = current
    return current


def served(app: FastAPI) -> Schema:
    """The document ``/openapi.json`` serves: narrowed to the app's engine,
    or FastAPI's own before an engine is attached. ``build_app`` installs it
    as ``app.openapi``."""
    current = _served(app)
    if current is None:
        return app.__class__.openapi(app)
    return current.document


async def endpoint(request: Request) -> JSONResponse:
    """``GET /openapi.json``: the served document, awaited off the loop when
    ``prepare``'s thread is still building it (FastAPI's own route would
    build it on the loop: most of a second that every request waits)."""
    task: asyncio.Task[_Served] | None = getattr(
        request.app.state, "openapi_task", None
    )
    if task is not None and not task.done():
        await asyncio.shield(task)
    return JSONResponse(served(request.app))


async def check_body(
    conn: HTTPConnection,
    route: str,
    body: Mapping[str, Any],
    media_type: str = _JSON,
) -> None:
    """400 ``VLLMValidationError`` naming the first field of ``body`` that
    the served document does not admit for ``route``."""
    task: asyncio.Task[_Served] | None = getattr(conn.app.state, "openapi_task", None)
    if task is not None and not task.done():
        # Shielded: a request that goes away must not cancel the build.
        await asyncio.shield(task)
    current = _served(conn.app)
    if current is None:
        raise RuntimeError("check_body needs the app's engine")
    error = first_error(
        current.validators[route, media_type],
        current.roots[route, media_type],
        body,
        current.formats,
    )
    if error is not None:
        raise error
