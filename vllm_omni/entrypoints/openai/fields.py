"""Honoured or refused: every field of each route's OpenAI request (docs/design.md §10).

Owns the table that says, for each field a route's request model defines,
who honours it: the route itself (``ROUTE``, whatever the pipeline), the
stage kinds listed (the stage that owns the route's work: the text stage of
chat and completions, the talker of speech, the image stage of images), or
nobody. ``check_fields`` raises a 400 ``VLLMValidationError`` naming
(``parameter``) the first field a request sets to anything but its default
that the owning stage does not honour, with the reason. A 200 therefore
means every field the client set took effect.

A field the table does not list is refused: a field of the request model
that nobody decided about (an upstream release that adds one) because it is
not supported, any other name because it is not a field of the route (a
misspelling: the message suggests the closest field, as ``difflib`` finds
it). OpenAI's API refuses an unrecognized argument the same way; vLLM's
``OpenAIBaseModel`` logs it and answers 200, which here would be a 200 that
did not honour what the client asked. vLLM's fields, vllm-omni 0.30's and
the OpenAI API's are in the tables, each honoured where the route runs the
stage that can do what it asks, or refused with the reason; a nested one
(chat's ``extra_body``) is checked key by key as ``extra_body.<key>``.

``markdown`` renders the table for ``docs/serving.md``; a test keeps the two
equal. This module must not import vLLM: the request models live in
``protocol.py``; the routes hand their instances (or, for form and event
routes, a mapping of every field the client gave) to ``check_fields``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_omni.errors import VLLMValidationError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from vllm_omni.config import StageConfig

__all__ = [
    "IMAGE_EDITS",
    "IMAGE_EDITS_030",
    "ROUTE",
    "ROUTES",
    "VIDEOS",
    "FieldRule",
    "check_fields",
    "markdown",
]

ROUTE = "route"
_TEXT = frozenset({"text", "vllm"})
_VLLM = frozenset({"vllm"})
_NOBODY: frozenset[str] = frozenset()
_END_USER = "an end-user id for the operator; no effect on output"


@dataclass(frozen=True, slots=True)
class FieldRule:
    """Who honours a field, how (or why nobody does), and values refused even
    where it is honoured (``refuse`` returns the reason, or ``None``). A
    ``nested`` field is a mapping of the route's own fields, each checked
    under ``name.key``."""

    honoured_by: frozenset[str]
    how: str
    refuse: Callable[[Any], str | None] | None = None
    nested: bool = False


def _rule(
    by: Iterable[str], how: str, refuse: Callable[[Any], str | None] | None = None
) -> FieldRule:
    return FieldRule(frozenset(by), how, refuse)


def _tool_choice(value: Any) -> str | None:
    if value in (None, "none"):
        return None
    return "tool calls need a tool parser, which this server does not run"


def _stream_options(value: Any) -> str | None:
    continuous = (
        value.get("continuous_usage_stats")
        if isinstance(value, Mapping)
        else getattr(value, "continuous_usage_stats", None)
    )
    if continuous:
        return "continuous_usage_stats is not supported; use include_usage"
    return None


def _single_prompt(value: Any) -> str | None:
    if isinstance(value, str):
        return None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return None
    return "prompt must be one string (batched and token-id prompts are not supported)"


# Sampling and rendering fields a ``vllm`` stage hands to upstream unchanged:
# upstream's ``to_sampling_params`` / renderer apply them, and validate them
# with their own ``parameter``.
_UPSTREAM_SAMPLING = {
    "frequency_penalty": "SamplingParams.frequency_penalty",
    "presence_penalty": "SamplingParams.presence_penalty",
    "repetition_penalty": "SamplingParams.repetition_penalty",
    "top_p": "SamplingParams.top_p",
    "top_k": "SamplingParams.top_k",
    "min_p": "SamplingParams.min_p",
    "stop_token_ids": "SamplingParams.stop_token_ids",
    "min_tokens": "SamplingParams.min_tokens",
    "ignore_eos": "SamplingParams.ignore_eos",
    "logit_bias": "SamplingParams.logit_bias",
    "allowed_token_ids": "SamplingParams.allowed_token_ids",
    "bad_words": "SamplingParams.bad_words",
    "include_stop_str_in_output": "SamplingParams.include_stop_str_in_output",
    "skip_special_tokens": "SamplingParams.skip_special_tokens",
    "spaces_between_special_tokens": "SamplingParams.spaces_between_special_tokens",
    "response_format": "structured outputs (json_object, json_schema, ...)",
    "structured_outputs": "structured outputs",
    "watermarking": "SamplingParams.watermarking",
    "repetition_detection": "SamplingParams.repetition_detection",
    "vllm_xargs": "SamplingParams.extra_args",
    "stream_interval": "the engine's streaming interval",
    "truncate_prompt_tokens": "upstream's tokenizer parameters",
    "truncation_side": "upstream's tokenizer parameters",
    "add_special_tokens": "upstream's tokenizer parameters",
    "priority": "the engine's scheduler (needs --scheduling-policy priority)",
    "cache_salt": "the engine's prefix cache",
    "mm_processor_kwargs": "upstream's renderer",
    "media_io_kwargs": "upstream's renderer",
}

# Fields of upstream's models that no stage honours, and why.
_REFUSED = {
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty applies to beam search, which is not supported",
    "echo": "echo is not supported",
    "prompt_logprobs": "prompt logprobs are not supported",
    "logprob_token_ids": "logprobs of chosen token ids are not supported",
    "return_tokens_as_token_ids": "token-id output is not supported",
    "return_token_ids": "token-id output is not supported",
    "return_token_offsets": "token offsets are not supported",
    "return_prompt_text": "the prompt text is not returned",
    "return_weight_versions": "weight versions are not returned",
    "return_mm_kwargs": "multimodal kwargs are not returned",
    "mm_payload": "multimodal payloads are not returned",
    "kv_transfer_params": "disaggregated prefill is not supported",
    "ec_transfer_params": "disaggregated encoding is not supported",
    "session_id": "sessions are not supported",
    "routed_experts_prompt_start": "expert routing output is not supported",
    "request_id": "set the request id with the X-Request-Id header",
    "reasoning_effort": "reasoning needs a reasoning parser, which this server "
    "does not run",
    "thinking_token_budget": "reasoning needs a reasoning parser, which this "
    "server does not run",
    "prompt_embeds": "prompt embeddings are not supported",
    "chat_template": "a request's own chat template is not trusted",
}

# vllm-omni's per-stage list: every route that runs stages reads it.
SAMPLING_PARAMS_LIST = _rule(
    [ROUTE],
    "entry i configures stage i, checked as that stage's parameters; it wins "
    "over the request's fields for its stage (vllm-omni extension)",
)

# Routes that also read a form: there the list is the field's JSON text.
FORM_SAMPLING_PARAMS_LIST = _rule(
    [ROUTE], f"{SAMPLING_PARAMS_LIST.how}; in a form, its JSON text"
)

_GENERATE_COMMON: dict[str, FieldRule] = {
    "model": _rule([ROUTE], "checked against the served model (404 otherwise)"),
    "stream": _rule([ROUTE], "SSE stream"),
    "stream_options": _rule(
        [ROUTE], "include_usage: a last chunk with usage", _stream_options
    ),
    "user": _rule([ROUTE], _END_USER),
    "max_tokens": _rule(_TEXT, "the length limit"),
    "temperature": _rule(_TEXT, "sampling temperature"),
    "seed": _rule(_TEXT, "sampling seed"),
    "stop": _rule(_TEXT, "the text ends before the first stop string"),
    "n": _rule(_TEXT, "n choices (streamed with their index)"),
    "logprobs": _rule(_VLLM, "per-token logprobs, OpenAI shape"),
    **{name: _rule(_VLLM, how) for name, how in _UPSTREAM_SAMPLING.items()},
    **{name: _rule(_NOBODY, why) for name, why in _REFUSED.items()},
}

# vllm-omni 0.30's chat extras (its ``serving_chat.py``): the talker's voice
# (honoured), the rest of its speech and diffusion-chat settings (refused).
_CHAT_GENERATES = (
    "chat answers with text and audio here; images and video come from "
    "POST /v1/images/generations and POST /v1/videos"
)
_CHAT_030: dict[str, FieldRule] = {
    "voice": _rule(
        [ROUTE], 'the talker\'s voice, as audio.voice (needs "audio" in modalities)'
    ),
    "speaker": _rule([ROUTE], "vllm-omni's name for voice"),
    "language": _rule(_NOBODY, "the talker has no language setting"),
    "instructions": _rule(_NOBODY, "voice instructions are not supported"),
    "ref_audio": _rule(_NOBODY, "voice cloning is not supported"),
    "additional_information": _rule(
        _NOBODY, "model-specific prompt information is not supported"
    ),
    "extra_body": FieldRule(
        frozenset([ROUTE]),
        "a JSON body's nested extra_body: each key is checked as extra_body.<key>; "
        "none is read from there (the OpenAI SDK sends extra_body's keys at the "
        "top level)",
        nested=True,
    ),
    **{
        name: _rule(_NOBODY, _CHAT_GENERATES)
        for name in (
            "height",
            "width",
            "size",
            "num_outputs_per_prompt",
            "quality",
            "num_inference_steps",
            "guidance_scale",
            "guidance_scale_2",
            "true_cfg_scale",
            "cfg_scale",
            "num_frames",
            "layers",
            "resolution",
            "negative_prompt",
            "generator_device",
            "strength",
            "bot_task",
            "system_prompt",
            "use_system_prompt",
            "sys_type",
        )
    },
    "extra_args": _rule(_NOBODY, "model-specific parameters are not supported"),
    "extra_params": _rule(_NOBODY, "model-specific parameters are not supported"),
    "return_stage_metrics": _rule(
        _NOBODY, "stage metrics are on /metrics, not in responses"
    ),
}

# The OpenAI API's chat fields that upstream's model does not define (vLLM
# logs and ignores them): refused by name, with the reason.
_CHAT_OPENAI: dict[str, FieldRule] = {
    "functions": _rule(
        _NOBODY, "function calls need a tool parser, which this server does not run"
    ),
    "function_call": _rule(
        _NOBODY, "function calls need a tool parser, which this server does not run"
    ),
    "metadata": _rule(_NOBODY, "completions are not stored, nor their metadata"),
    "store": _rule(_NOBODY, "completions are not stored"),
    "moderation": _rule(_NOBODY, "moderation is not supported"),
    "prediction": _rule(_NOBODY, "predicted outputs are not supported"),
    **{
        name: _rule(
            _NOBODY,
            "prompt cache settings are not supported (the engine's prefix cache "
            "needs none; cache_salt isolates it)",
        )
        for name in (
            "prompt_cache_key",
            "prompt_cache_options",
            "prompt_cache_retention",
        )
    },
    "safety_identifier": _rule([ROUTE], _END_USER),
    "service_tier": _rule(_NOBODY, "service tiers are not supported"),
    "verbosity": _rule(_NOBODY, "verbosity levels are not supported"),
    "web_search_options": _rule(_NOBODY, "web search is not supported"),
}

CHAT: dict[str, FieldRule] = {
    **_GENERATE_COMMON,
    "messages": _rule(
        [ROUTE],
        "text parts; a vllm stage renders them with the model's chat template",
    ),
    "max_completion_tokens": _rule(_TEXT, "the length limit (over max_tokens)"),
    "top_logprobs": _rule(_VLLM, "top logprobs per token, OpenAI shape"),
    "tools": _rule(_VLLM, "rendered into the chat template (tool_choice none)"),
    "tool_choice": _rule(_VLLM, "only none: no tool parser runs", _tool_choice),
    "parallel_tool_calls": _rule(_VLLM, "no effect without tool calls"),
    "include_reasoning": _rule(
        _VLLM, "no reasoning parser runs, so no reasoning is ever included"
    ),
    "add_generation_prompt": _rule(_VLLM, "chat template"),
    "continue_final_message": _rule(_VLLM, "chat template"),
    "documents": _rule(_VLLM, "chat template"),
    "chat_template_kwargs": _rule(_VLLM, "chat template"),
    "modalities": _rule([ROUTE], 'text, or text and audio ("audio" needs a talker)'),
    "audio": _rule([ROUTE], "voice for the talker stage; format wav"),
    "lora": _rule(_VLLM, "a LoRA adapter by name (vLLM-Omni extension)"),
    "sampling_params_list": SAMPLING_PARAMS_LIST,
    **_CHAT_030,
    **_CHAT_OPENAI,
}

COMPLETIONS: dict[str, FieldRule] = {
    **_GENERATE_COMMON,
    "prompt": _rule([ROUTE], "one string", _single_prompt),
    "suffix": _rule(_VLLM, "fill-in-the-middle, where the model renders it"),
    "lora": _rule(_VLLM, "a LoRA adapter by name (vLLM-Omni extension)"),
    "sampling_params_list": SAMPLING_PARAMS_LIST,
    # The OpenAI API's, which upstream's model does not define.
    "best_of": _rule(_NOBODY, "best_of is not supported"),
}

# vllm-omni 0.30's speech fields that the reference talker does not honour.
_SPEECH_030 = {
    "stream": "only whole audio (stream_format audio)",
    "sample_rate": "the audio is 16 kHz",
    "task_type": "TTS task types are not supported",
    "language": "the talker has no language setting",
    "ref_audio": "voice cloning is not supported",
    "ref_text": "voice cloning is not supported",
    "ref_audio_2": "voice cloning is not supported",
    "ambient_sound": "ambient sound is not supported",
    "duration_seconds": "a target duration is not supported",
    "x_vector_only_mode": "voice cloning is not supported",
    "speaker_embedding": "speaker embeddings are not supported",
    "max_new_tokens": "the talker's length follows the input",
    "seed": "the talker is deterministic",
    "initial_codec_chunk_frames": "only whole audio (stream_format audio)",
    "non_streaming_mode": "only whole audio (stream_format audio)",
    "extra_params": "model-specific parameters are not supported",
    "word_timestamps": "word timestamps are not returned",
}

SPEECH: dict[str, FieldRule] = {
    "model": _rule([ROUTE], "checked against the served model (404 otherwise)"),
    "input": _rule([ROUTE], "the text to speak"),
    "voice": _rule(
        {"talker"}, "one of GET /v1/audio/voices (404 otherwise); alias speaker"
    ),
    "speaker": _rule({"talker"}, "vllm-omni's name for voice"),
    "response_format": _rule([ROUTE], "wav only"),
    "speed": _rule({"talker"}, "0.25 to 4"),
    "instructions": _rule(_NOBODY, "voice instructions are not supported"),
    "stream_format": _rule(_NOBODY, "only whole audio (stream_format audio)"),
    "sampling_params_list": SAMPLING_PARAMS_LIST,
    **{name: _rule(_NOBODY, why) for name, why in _SPEECH_030.items()},
}

# The OpenAI API's newer image fields, which no model here defines.
_IMAGES_OPENAI = {
    "complexity": "complexity levels are not supported",
    "frame_count": "the output is PNG (no GIF frames)",
    "frame_duration_ms": "the output is PNG (no GIF frames)",
    "svg": "the output is PNG (no SVG)",
}

_IMAGES_COMMON: dict[str, FieldRule] = {
    "model": _rule([ROUTE], "checked against the served model (404 otherwise)"),
    "prompt": _rule([ROUTE], "the image prompt"),
    "n": _rule({"image"}, "1 to 10 images"),
    "size": _rule({"image"}, "WxH, sides 64 to 1024, multiples of 8"),
    "response_format": _rule([ROUTE], "b64_json only"),
    "user": _rule([ROUTE], _END_USER),
    "quality": _rule(_NOBODY, "quality levels are not supported"),
    "background": _rule(_NOBODY, "background control is not supported"),
    "output_format": _rule(_NOBODY, "the output is PNG"),
    "output_compression": _rule(_NOBODY, "the output is PNG"),
    "stream": _rule(_NOBODY, "image streaming is not supported"),
    "partial_images": _rule(_NOBODY, "image streaming is not supported"),
    "sampling_params_list": SAMPLING_PARAMS_LIST,
    "safety_identifier": _rule([ROUTE], _END_USER),
    **{name: _rule(_NOBODY, why) for name, why in _IMAGES_OPENAI.items()},
}

# vllm-omni 0.30's image fields (diffusion settings) the reference image
# stage does not honour.
_DIFFUSION = "diffusion settings are not supported by this image stage"
_IMAGES_030 = {
    "bot_task": "AR task modes are not supported",
    "layers": "layered output is not supported",
    "negative_prompt": "negative prompts are not supported",
    "system_prompt": "system prompts are not supported",
    "use_system_prompt": "system prompts are not supported",
    "num_inference_steps": _DIFFUSION,
    "guidance_scale": _DIFFUSION,
    "true_cfg_scale": _DIFFUSION,
    "flow_shift": _DIFFUSION,
    "extra_params": "model-specific parameters are not supported",
    "generator_device": _DIFFUSION,
    "lora": "image LoRA adapters are not supported",
    "vae_use_slicing": _DIFFUSION,
    "vae_use_tiling": _DIFFUSION,
    "return_stage_metrics": "stage metrics are on /metrics, not in responses",
}

IMAGE_GENERATIONS: dict[str, FieldRule] = {
    **_IMAGES_COMMON,
    "seed": _rule({"image"}, "seed (vLLM-Omni extension)"),
    "style": _rule(_NOBODY, "styles are not supported"),
    "moderation": _rule(_NOBODY, "moderation levels are not supported"),
    **{name: _rule(_NOBODY, why) for name, why in _IMAGES_030.items()},
}

# vllm-omni 0.30's image edit form fields the reference image stage does not
# honour (its generation fields' reasons, and its extra inputs).
_EDITS_030 = {
    **{
        name: _IMAGES_030[name]
        for name in (
            "negative_prompt",
            "num_inference_steps",
            "guidance_scale",
            "true_cfg_scale",
            "generator_device",
            "lora",
            "layers",
            "bot_task",
            "system_prompt",
            "return_stage_metrics",
        )
    },
    "guidance_scale_2": _DIFFUSION,
    "strength": _DIFFUSION,
    "resolution": "layered output is not supported",
    "sys_type": "system prompts are not supported",
    "mask_image": "masks are not supported",
    "reference_image": "reference images are not supported",
    "image[]": "one input image per edit (image)",
    "url": "input images by URL are not supported",
    "url[]": "input images by URL are not supported",
}

# The OpenAI API's edit field that no model here defines.
_EDITS_OPENAI = {"markup": "markup on the input image is not supported"}

# The form fields the edits route reads as the client gave them (FastAPI
# types none): vllm-omni 0.30's, and the OpenAI API's that the route's
# signature does not list.
IMAGE_EDITS_030: frozenset[str] = frozenset(
    {**_EDITS_030, **_IMAGES_OPENAI, **_EDITS_OPENAI}
)

IMAGE_EDITS: dict[str, FieldRule] = {
    **_IMAGES_COMMON,
    "image": _rule({"image"}, "the image to edit (PNG, JPEG, GIF, WebP)"),
    "mask": _rule(_NOBODY, "masks are not supported"),
    "input_fidelity": _rule(_NOBODY, "input fidelity is not supported"),
    "sampling_params_list": FORM_SAMPLING_PARAMS_LIST,
    "seed": _rule({"image"}, "seed (vLLM-Omni extension)"),
    **{name: _rule(_NOBODY, why) for name, why in _EDITS_030.items()},
    **{name: _rule(_NOBODY, why) for name, why in _EDITS_OPENAI.items()},
}

# vllm-omni 0.30's video fields the reference video stage does not honour.
_VIDEO_DIFFUSION = "diffusion settings are not supported by this video stage"
_VIDEOS_030 = {
    "num_frames": "the frame count follows seconds and fps",
    "video_params": "send size, fps and seconds at the top level",
    "image_reference": "reference inputs are not supported",
    "video_reference": "reference inputs are not supported",
    "audio_reference": "reference inputs are not supported",
    "control_type": "reference inputs are not supported",
    "aspect_ratio": "the shape is given by size",
    "short_edge": "the shape is given by size",
    "num_outputs_per_prompt": "one video per job",
    "start_time_seconds": "reference inputs are not supported",
    "quality": _VIDEO_DIFFUSION,
    "negative_prompt": "negative prompts are not supported",
    "num_inference_steps": _VIDEO_DIFFUSION,
    "guidance_scale": _VIDEO_DIFFUSION,
    "guidance_scale_2": _VIDEO_DIFFUSION,
    "boundary_ratio": _VIDEO_DIFFUSION,
    "flow_shift": _VIDEO_DIFFUSION,
    "true_cfg_scale": _VIDEO_DIFFUSION,
    "generate_sound": "the video has no sound",
    "sound_duration": "the video has no sound",
    "enable_frame_interpolation": "frame interpolation is not supported",
    "frame_interpolation_exp": "frame interpolation is not supported",
    "frame_interpolation_scale": "frame interpolation is not supported",
    "frame_interpolation_model_path": "frame interpolation is not supported",
    "lora": "video LoRA adapters are not supported",
    "extra_params": "model-specific parameters are not supported",
    "return_stage_metrics": "stage metrics are on /metrics, not in responses",
}

VIDEOS: dict[str, FieldRule] = {
    "model": _rule([ROUTE], "checked against the served model (404 otherwise)"),
    "prompt": _rule([ROUTE], "the video prompt"),
    "seconds": _rule({"video"}, "0.1 to 10 s"),
    "size": _rule({"video"}, "WxH, sides 64 to 512, multiples of 8"),
    "sampling_params_list": FORM_SAMPLING_PARAMS_LIST,
    "user": _rule([ROUTE], _END_USER),
    "width": _rule({"video"}, "with height, the size WxH (vLLM-Omni; not with size)"),
    "height": _rule({"video"}, "with width, the size WxH (vLLM-Omni; not with size)"),
    "fps": _rule({"video"}, "frames per second, 1 to 30 (vLLM-Omni extension)"),
    "seed": _rule({"video"}, "seed (vLLM-Omni extension)"),
    "input_reference": _rule(_NOBODY, "reference inputs are not supported"),
    **{name: _rule(_NOBODY, why) for name, why in _VIDEOS_030.items()},
}

REALTIME_RESPONSE: dict[str, FieldRule] = {
    "instructions": _rule([ROUTE], "the prompt"),
    "modalities": _rule([ROUTE], '["text"] or ["text", "audio"]'),
    "max_tokens": _rule(_TEXT, "the length limit"),
    "max_response_output_tokens": _rule(_NOBODY, "use max_tokens"),
    "temperature": _rule(_TEXT, "sampling temperature"),
    "voice": _rule({"talker"}, "the talker's voice"),
    "output_audio_format": _rule(_NOBODY, "audio is a WAV"),
    "tools": _rule(_NOBODY, "tool calls are not supported"),
    "tool_choice": _rule(_NOBODY, "tool calls are not supported"),
    "conversation": _rule(_NOBODY, "conversations are not supported"),
    "input": _rule(_NOBODY, "conversation items are not supported"),
    "metadata": _rule(_NOBODY, "metadata is not stored"),
    "sampling_params_list": SAMPLING_PARAMS_LIST,
}

# Route → (its request's table, the operation it documents).
ROUTES: dict[str, tuple[dict[str, FieldRule], str]] = {
    "chat": (CHAT, "POST /v1/chat/completions"),
    "completions": (COMPLETIONS, "POST /v1/completions"),
    "speech": (SPEECH, "POST /v1/audio/speech"),
    "image_generations": (IMAGE_GENERATIONS, "POST /v1/images/generations"),
    "image_edits": (IMAGE_EDITS, "POST /v1/images/edits"),
    "videos": (VIDEOS, "POST /v1/videos"),
    "realtime": (REALTIME_RESPONSE, "WS /v1/realtime, response.create"),
}


# What a route's unknown field is not a field of, where the operation alone
# does not say it.
_OF = {"realtime": "a response.create event's response"}


def _set_fields(
    request: BaseModel | Mapping[str, Any], table: Mapping[str, FieldRule]
) -> Iterable[tuple[str, Any]]:
    """(name, value) of every field the client set to something but its
    default, and of every name the client gave that the route does not know
    (whatever its value: a misspelled field is a mistake even when null)."""
    if isinstance(request, Mapping):
        yield from (
            (k, v) for k, v in request.items() if v is not None or k not in table
        )
        return
    given = request.model_fields_set
    # In the model's order: a field the client sent comes before one that a
    # validator set from it (``tools`` before the ``tool_choice`` it implies).
    for name, field in type(request).model_fields.items():
        if name not in given:
            continue
        value = getattr(request, name)
        if value is None or (
            not field.is_required()
            and value == field.get_default(call_default_factory=True)
        ):
            continue
        yield name, value
    # The names outside the model (``extra="allow"``), as the client gave them.
    for name, value in (request.model_extra or {}).items():
        if value is not None or name not in table:
            yield name, value


def check_fields(
    route: str,
    request: BaseModel | Mapping[str, Any],
    stages: Sequence[StageConfig],
    *,
    prefix: str = "",
) -> None:
    """Refuse (400, ``parameter`` = the field) the first field ``request``
    sets that none of ``stages`` (the stages doing the route's work, the
    owner first) honours, or that is not a field of the route at all.

    ``request`` is the route's validated request model (its extras
    included), or for form and event routes a mapping of every field the
    client gave (those at their default may be left out).
    """
    table = ROUTES[route][0]
    kinds = {stage.kind for stage in stages}
    for name, value in _set_fields(request, table):
        rule = table.get(name)
        if rule is not None and rule.nested and isinstance(value, Mapping):
            _check_nested(route, f"{prefix}{name}.", value, stages)
            continue
        if rule is None:
            if isinstance(request, Mapping) or name not in type(request).model_fields:
                raise _unknown(route, prefix, str(name))
            reason = "it is not supported by this server"
        elif ROUTE in rule.honoured_by or kinds & rule.honoured_by:
            reason = rule.refuse(value) if rule.refuse is not None else None
            if reason is None:
                continue
        elif rule.honoured_by and stages:
            owner = stages[0]
            reason = f"it is not supported by stage {owner.id} ({owner.name})"
        else:
            reason = rule.how
        raise VLLMValidationError(
            f"{prefix}{name} cannot be honoured: {reason}.",
            parameter=f"{prefix}{name}",
        )


def _unknown(route: str, prefix: str, name: str) -> VLLMValidationError:
    """The 400 on a name that is not a field of ``route``, with the closest
    field's name when one is close (a misspelling)."""
    table, operation = ROUTES[route]
    close = difflib.get_close_matches(name, table, n=1)
    hint = f"; did you mean {prefix}{close[0]}?" if close else "."
    # A name that is no identifier (empty, spaces) is shown as JSON.
    shown = name if name.isidentifier() else json.dumps(name, ensure_ascii=False)
    return VLLMValidationError(
        f"{prefix}{shown} is not a field of "
        f"{_OF.get(route, f'this route ({operation})')}{hint}",
        parameter=f"{prefix}{name}",
    )


def _check_nested(
    route: str, prefix: str, nested: Mapping[str, Any], stages: Sequence[StageConfig]
) -> None:
    """Refuse the first key of a nested mapping (``extra_body``), under
    ``prefix``: with the table's reason when the route refuses that field,
    else because it is read at the top level only."""
    for key in nested:
        if nested[key] is None:
            continue
        check_fields(route, {str(key): nested[key]}, stages, prefix=prefix)
        raise VLLMValidationError(
            f"{prefix}{key} cannot be honoured: it is read at the top level of "
            "the request only (where the OpenAI SDK's extra_body puts it).",
            parameter=f"{prefix}{key}",
        )


# The stage kinds each route's table is shown for in the docs.
_DOC_KINDS: dict[str, tuple[str, ...]] = {
    "chat": ("text", "vllm"),
    "completions": ("text", "vllm"),
    "speech": ("talker",),
    "image_generations": ("image",),
    "image_edits": ("image",),
    "videos": ("video",),
    "realtime": ("text", "vllm", "talker"),
}


def _who(rule: FieldRule | None, kinds: tuple[str, ...]) -> str:
    if rule is not None and ROUTE in rule.honoured_by:
        return "all"
    honoured = [kind for kind in kinds if rule and kind in rule.honoured_by]
    return ", ".join(f"`{kind}`" for kind in honoured) if honoured else "refused"


def markdown(route: str, names: Iterable[str] | None = None) -> list[str]:
    """The docs table of ``route``: each field (``names``, default the
    table's own), the stage kinds that honour it, and how, or why none does.
    A field of a request model that the table does not list is refused
    (``check_fields``)."""
    table, operation = ROUTES[route]
    kinds = _DOC_KINDS[route]
    lines = [
        f"{operation}:",
        "",
        "| field | honoured by | how / why not |",
        "| --- | --- | --- |",
    ]
    for name in names if names is not None else table:
        rule = table.get(name)
        how = rule.how if rule is not None else "not supported by this server"
        some = " (some values refused)" if rule is not None and rule.refuse else ""
        lines.append(f"| `{name}` | {_who(rule, kinds)}{some} | {how} |")
    return lines
