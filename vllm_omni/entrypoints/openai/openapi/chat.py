"""Narrowing chat completions and completions: the text stage's sampling
domains, the messages a stage reads, audio out through the talker, and the
cross-field rules (``stream_options`` needs ``stream``)."""

from __future__ import annotations

from vllm_omni.entrypoints.openai.openapi.narrowing import (
    Domains,
    Pipeline,
    entries_domain,
    narrow_fields,
    request_body,
)
from vllm_omni.entrypoints.openai.openapi.schema import (
    NULL,
    accepted,
    if_set,
    like,
    nonblank_text,
    requires,
)
from vllm_omni.entrypoints.openai.protocol import (
    EMPTY_TOOLS_ARE_NO_TOOLS,
    ROLES,
    ChatCompletionRequest,
    CompletionRequest,
)
from vllm_omni.entrypoints.openai.schema_errors import NOT_BLANK, Schema
from vllm_omni.stages import stage_range, stage_ranges
from vllm_omni.stages.ranges import Choices, Strings

__all__ = ["narrow_chat", "narrow_completions"]


# -- chat and completions -------------------------------------------------------------


def _stop(original: Schema, max_items: int) -> Schema:
    # An empty string or list is no stop at all (the route drops it).
    return like(
        original,
        {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "maxItems": max_items,
                },
            ]
        },
    )


def _text_domains(pipeline: Pipeline, kind: str | None) -> Domains:
    """The sampling fields the reference text stage checks, in the ranges it
    publishes (a ``vllm`` stage: upstream's schema)."""
    if kind != "text":
        return {}
    domains: Domains = {}
    for name, value in (stage_ranges(kind) or {}).items():
        if isinstance(value, Strings):
            domains[name] = lambda s, value=value: _stop(s, value.max_items)
        else:
            schema = accepted(value)
            domains[name] = lambda s, schema=schema: like(s, schema)
    return pipeline.of_stage(domains)


def _stream_options(original: Schema) -> Schema:
    return like(
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


def _generation_domains(pipeline: Pipeline, kind: str | None) -> Domains:
    return {
        "model": lambda s: pipeline.model_name(s, form=False),
        "stream_options": _stream_options,
        **_text_domains(pipeline, kind),
        **entries_domain(pipeline),
    }


_STREAM_OPTIONS_NEED_STREAM = if_set(
    "stream_options",
    {"type": "object", "minProperties": 1},
    requires("stream", {"const": True}),
)


def _messages_text(pipeline: Pipeline) -> Schema:
    """A reference text stage reads text only: each message is a role and
    non-blank text (a string, or text parts), optionally a name."""
    text = nonblank_text(pipeline.limits.max_prompt_chars, "text")
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


def narrow_chat(doc: Schema, pipeline: Pipeline) -> None:
    schema = request_body(doc, "chat")
    stage = pipeline.stages["text"]
    kind = pipeline.kind("text")
    talker = pipeline.kind("audio") == "talker"
    modalities = ["text", "audio"] if pipeline.stages.get("audio") else ["text"]
    audio_options = {
        "type": "object",
        "properties": {
            "voice": {
                "type": "string",
                "enum": list(stage_range("talker", "voice", Choices).values),
            }
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
        "modalities": lambda s: like(
            s,
            {
                "type": "array",
                "items": {"enum": modalities},
                "if": {"minItems": 1},
                "then": {"contains": {"const": "text"}},
            },
        ),
        "audio": lambda s: like(s, audio_options),
        "voice": lambda s: like(s, audio_options["properties"]["voice"]),
        "speaker": lambda s: like(s, audio_options["properties"]["voice"]),
        # Nothing is read from a nested extra_body: only empty (or nulls).
        "extra_body": lambda s: like(
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
        domains["tools"] = lambda s: like(s, {**s["anyOf"][0], "minItems": least})
    narrow_fields(schema, "chat", stage, domains, model=ChatCompletionRequest)
    tools = schema["properties"]["tools"]
    if EMPTY_TOOLS_ARE_NO_TOOLS and "enum" in tools:
        tools["enum"].append([])  # refused, but an empty list is no tools
    with_audio = {"type": "array", "contains": {"const": "audio"}}
    rules = [
        _STREAM_OPTIONS_NEED_STREAM,
        *(
            if_set(name, value, requires("modalities", with_audio))
            for name, value in (
                ("audio", {"type": "object"}),
                ("voice", {"type": "string"}),
                ("speaker", {"type": "string"}),
            )
        ),
        if_set("modalities", with_audio, {"properties": {"n": {"enum": [1, None]}}}),
    ]
    # The voice is given once: audio.voice, voice or speaker.
    no_audio_voice = {"anyOf": [NULL, {"properties": {"voice": False}}]}
    string = {"type": "string"}
    rules += [
        if_set("voice", string, {"properties": {"speaker": NULL}}),
        *(
            if_set(name, string, {"properties": {"audio": no_audio_voice}})
            for name in ("voice", "speaker")
        ),
    ]
    if kind == "vllm":
        rules.append(
            if_set(
                "tools", {"type": "array", "minItems": 1}, {"required": ["tool_choice"]}
            )
        )
    schema["allOf"] = rules


def narrow_completions(doc: Schema, pipeline: Pipeline) -> None:
    schema = request_body(doc, "completions")
    prompt = nonblank_text(pipeline.limits.max_prompt_chars, "the prompt")
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
    narrow_fields(
        schema,
        "completions",
        pipeline.stages["text"],
        domains,
        model=CompletionRequest,
    )
    schema["required"] = sorted({*schema.get("required", ()), "prompt"})
    schema["allOf"] = [_STREAM_OPTIONS_NEED_STREAM]
