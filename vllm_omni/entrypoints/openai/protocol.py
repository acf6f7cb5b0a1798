"""The request models of the OpenAI routes, and their constants.

One section per endpoint: chat and completions (upstream vLLM's own request
models, with vLLM-Omni's fields added), speech, images, and videos (a JSON or
form body described as schema for ``/openapi.json``, and its query
parameters). ``fields.py`` says which fields are honoured, ``openapi/``
narrows the schemas to the pipeline, the routes and serving modules read
them. This module imports no router, serving or ``openapi`` module.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as UpstreamChatCompletionRequest,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest as UpstreamCompletionRequest,
)

from vllm_omni.entrypoints.openai.schema_errors import wrong_json_type
from vllm_omni.errors import VLLMError, VLLMValidationError

__all__ = [
    "EMPTY_TOOLS_ARE_NO_TOOLS",
    "FORM_TYPES",
    "INT64_MAX",
    "INT64_MIN",
    "ROLES",
    "SAMPLING_PARAMS_LIST_DESCRIPTION",
    "VIDEO_CREATE_BODY",
    "VIDEO_DEFAULTS",
    "VIDEO_DEFAULT_PAGE",
    "VIDEO_MAX_PAGE",
    "VIDEO_MAX_PROMPT_CHARS",
    "VIDEO_PAGE_PARAMETERS",
    "VIDEO_VARIANTS",
    "VIDEO_VARIANT_PARAMETER",
    "AudioOptions",
    "Background",
    "ChatCompletionRequest",
    "CompletionRequest",
    "FaultToleranceApplyRequest",
    "ImageGenerationRequest",
    "Int64",
    "JsonTypesFirst",
    "OutputFormat",
    "PositiveInt64",
    "Quality",
    "SamplingParamsList",
    "SpeechRequest",
    "UpstreamChatCompletionRequest",
    "UpstreamCompletionRequest",
]

# -- shared ------------------------------------------------------------------------

# The form media types a route may read (videos).
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")

# Integers a request may carry: what the stage wire and upstream's sampling
# parameters hold. A larger one is a 400 naming its field, in the words of a
# field rule, before it reaches the engine.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
PositiveInt64 = Annotated[int, Field(ge=1, le=INT64_MAX)]


class JsonTypesFirst(BaseModel):
    """Put first in the bases of a subclass of upstream's request model.

    Upstream's ``mode="before"`` validators read the client's raw JSON
    before pydantic checks its types, and some raise ``TypeError`` or
    ``AttributeError`` on a form they do not expect (``"messages": 5``,
    ``"structured_outputs": true``; a system message's content part whose
    ``type`` is a list breaks a log call): an unknown exception, a 500.
    They read nothing but the client's JSON, so it is a client mistake, a
    400 naming the field: the one the model's own JSON schema does not
    admit, else the top-level field without which the validators pass.
    """

    @model_validator(mode="wrap")
    @classmethod
    def _json_types_first(
        cls, data: Any, handler: ModelWrapValidatorHandler[BaseModel]
    ) -> BaseModel:
        try:
            return handler(data)
        except (TypeError, AttributeError):
            error = wrong_json_type(cls, data) or _unreadable_field(data, handler)
            if error is None:
                raise
            raise error from None


def _unreadable_field(
    data: Any, handler: ModelWrapValidatorHandler[BaseModel]
) -> VLLMValidationError | None:
    """The 400 on the first top-level field of ``data`` without which
    upstream's validators no longer raise ``TypeError``/``AttributeError``."""
    if not isinstance(data, dict):
        return None
    for name in data:
        try:
            handler({key: value for key, value in data.items() if key != name})
        except (TypeError, AttributeError):
            continue
        except (ValidationError, VLLMError):
            # Another mistake (a field now missing): this one is gone.
            pass
        return VLLMValidationError(
            f"{name} has a form this server cannot read", parameter=str(name)
        )
    return None


# vllm-omni's per-stage sampling parameters (``extra_body``): entry *i*
# configures stage *i*; docs/serving.md, "Per-stage sampling parameters".
# Entries are checked against their stage, which names the place of a
# mistake as ``sampling_params_list.1.top_k``.
SamplingParamsList = list[Any]
SAMPLING_PARAMS_LIST_DESCRIPTION = (
    "vllm-omni's per-stage sampling parameters: entry i configures the stage "
    "with id i (null or {} keeps its defaults) and wins over the request's own "
    "fields for that stage; each entry is checked as that stage's parameters."
)


def sampling_params_list_field() -> Any:
    return Field(default=None, description=SAMPLING_PARAMS_LIST_DESCRIPTION)


# -- chat --------------------------------------------------------------------------

# Roles of the OpenAI chat API. Upstream also accepts any other string (a
# custom role its templates may know); a stricter refusal here, documented
# in docs/errors/status-mapping.md.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _reads_empty_tools_as_none() -> bool:
    """Whether the installed vLLM's chat request reads ``tools: []`` as no
    tools (0.34, as OpenAI does) instead of refusing it (0.33: a 400 naming
    ``tools``)."""
    try:
        request = UpstreamChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "tools": []}
        )
    except (VLLMError, ValidationError):
        return False
    return request.tools is None


# ``/openapi.json`` admits ``tools: []`` exactly where upstream does.
EMPTY_TOOLS_ARE_NO_TOOLS = _reads_empty_tools_as_none()


class AudioOptions(BaseModel):
    voice: str = "alloy"
    format: Literal["wav"] = "wav"


# A name that is not a field of the route is refused (``fields.py``), so the
# request schemas say so, though the models keep such names (``extra="allow"``)
# for that check to name them.
_NO_OTHER_FIELDS = ConfigDict(json_schema_extra={"additionalProperties": False})


class ChatCompletionRequest(JsonTypesFirst, UpstreamChatCompletionRequest):
    """Upstream's chat request, plus the fields vLLM-Omni adds."""

    model_config = _NO_OTHER_FIELDS

    # Upstream caches its field names per class (extras logging): ours.
    field_names: ClassVar[set[str] | None] = None

    # The OpenAI API's end-user id, which upstream's model lacks (``user``'s
    # successor there): accepted, as ``user`` is.
    safety_identifier: str | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOptions | None = None
    # A LoRA adapter by name (``extra_body={"lora": ...}``); the stage decides.
    lora: str | None = None
    sampling_params_list: SamplingParamsList | None = sampling_params_list_field()
    # vllm-omni 0.30's chat extras (its ``serving_chat.py``), each honoured or
    # refused by name (``fields.py``): the talker's voice, as 0.30 reads it
    # (``voice``, else ``speaker``) ...
    voice: str | None = None
    speaker: str | None = None
    language: str | None = None
    instructions: str | None = None
    ref_audio: str | None = None
    additional_information: dict[str, Any] | None = None
    # ... a nested ``extra_body`` (its example clients post one as JSON) ...
    extra_body: dict[str, Any] | None = None
    # ... and the image and video generation settings of its diffusion chat.
    height: int | None = None
    width: int | None = None
    size: str | None = None
    num_outputs_per_prompt: int | None = None
    quality: str | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    true_cfg_scale: float | None = None
    cfg_scale: float | None = None
    num_frames: int | None = None
    layers: int | None = None
    resolution: int | None = None
    negative_prompt: str | None = None
    generator_device: str | None = None
    strength: float | None = None
    bot_task: str | None = None
    system_prompt: str | None = None
    use_system_prompt: str | None = None
    sys_type: str | None = None
    extra_args: dict[str, Any] | None = None
    extra_params: dict[str, Any] | None = None
    return_stage_metrics: bool | None = None

    @model_validator(mode="after")
    def _check_request(self) -> ChatCompletionRequest:
        """What the request alone decides, each a 400 on its field: every
        role is one of the OpenAI API's; ``n > 1``, ``audio``, ``voice`` and
        ``speaker`` only with audio output; the voice given once."""
        for i, message in enumerate(self.messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ROLES:
                raise VLLMValidationError(
                    f"role must be one of {', '.join(ROLES)}",
                    parameter=f"messages.{i}.role",
                )
        modalities = self.output_modalities()
        if "audio" in modalities and (self.n or 1) > 1:
            raise VLLMValidationError(
                "n > 1 is not supported with audio output", parameter="n"
            )
        for name in ("audio", "voice", "speaker"):
            if getattr(self, name) is not None and "audio" not in modalities:
                raise VLLMValidationError(
                    f'{name} needs "audio" in modalities', parameter=name
                )
        given = self._voices()
        if len(given) > 1:
            name = given[1][0]
            raise VLLMValidationError(
                f"{name} cannot be honoured: the voice is given once "
                f"(here also as {given[0][0]})",
                parameter=name,
            )
        return self

    def output_modalities(self) -> list[str]:
        """``modalities``, text when not given."""
        return list(self.modalities or ["text"])

    def talker_voice(self) -> str | None:
        """The talker's voice: ``audio.voice``, or vllm-omni's ``voice`` or
        ``speaker`` (given once: checked), else ``audio``'s default."""
        given = self._voices()
        if given:
            return given[0][1]
        return self.audio.voice if self.audio is not None else None

    def _voices(self) -> list[tuple[str, str]]:
        audio = self.audio
        named = audio.voice if audio and "voice" in audio.model_fields_set else None
        return [
            (name, value)
            for name, value in (
                ("audio.voice", named),
                ("voice", self.voice),
                ("speaker", self.speaker),
            )
            if value is not None
        ]


# -- completions -------------------------------------------------------------------


class CompletionRequest(JsonTypesFirst, UpstreamCompletionRequest):
    """Upstream's completion request, plus the fields vLLM-Omni adds."""

    model_config = _NO_OTHER_FIELDS

    # Upstream caches its field names per class (extras logging): ours.
    field_names: ClassVar[set[str] | None] = None

    # A LoRA adapter by name (``extra_body={"lora": ...}``); the stage decides.
    lora: str | None = None
    sampling_params_list: SamplingParamsList | None = sampling_params_list_field()

    @model_validator(mode="after")
    def _check_request(self) -> CompletionRequest:
        """One prompt, a string (or a list of one): a 400 on ``prompt``."""
        self.single_prompt()
        return self

    def single_prompt(self) -> str:
        """The one prompt the request carries."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise VLLMValidationError("prompt must be a string", parameter="prompt")
        return prompt


# -- speech ------------------------------------------------------------------------


def _speech_schema(schema: dict[str, Any]) -> None:
    """No other field; ``speaker``, the voice's alias, is one of the body's
    (pydantic's schema names an alias field by its first alias only)."""
    schema["additionalProperties"] = False
    schema["properties"]["speaker"] = {
        "type": "string",
        "title": "Speaker",
        "description": "vllm-omni's name for voice (one of them may be given).",
    }


class SpeechRequest(BaseModel):
    """OpenAI's speech request; every field is honoured or refused
    (``fields.py``); any other name is refused there, as not a field of the
    route (``extra="allow"`` keeps it for that check)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_speech_schema)

    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    # vllm-omni's clients send the voice as ``speaker`` (its alias there).
    voice: str = Field(
        default="alloy", validation_alias=AliasChoices("voice", "speaker")
    )
    response_format: Literal["wav"] = "wav"
    speed: float | None = None
    instructions: str | None = None
    stream_format: Literal["sse", "audio"] = "audio"
    sampling_params_list: SamplingParamsList | None = sampling_params_list_field()
    # vllm-omni 0.30's speech fields, each refused by name (``fields.py``).
    stream: bool = False
    sample_rate: int | None = None
    task_type: str | None = None
    language: str | None = None
    ref_audio: str | list[str] | None = None
    ref_text: str | None = None
    ref_audio_2: str | None = None
    ambient_sound: str | None = None
    duration_seconds: float | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: list[float] | list[list[float]] | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    initial_codec_chunk_frames: int | None = None
    non_streaming_mode: bool | None = None
    extra_params: dict[str, Any] | None = None
    word_timestamps: bool = False


# -- fault tolerance ---------------------------------------------------------------


class FaultToleranceApplyRequest(BaseModel):
    """vLLM 0.34's ``/v1/fault_tolerance/apply`` body (``instruction``,
    ``params``, the ``request_id`` of the recovery round) and the stage it
    is for: ``stage_id`` may be left out when exactly one stage's engine runs
    fault tolerance. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    instruction: Literal["retry", "scale_down"]
    params: dict[str, Any] = {}
    request_id: str = Field(min_length=1, max_length=128)
    stage_id: int | None = Field(default=None, ge=0, le=INT64_MAX)


# -- images ------------------------------------------------------------------------

# The OpenAI API's domains: a value outside one is a 400 naming the field.
Quality = Literal["standard", "hd", "low", "medium", "high", "auto"]
Background = Literal["transparent", "opaque", "auto"]
OutputFormat = Literal["png", "jpeg", "webp"]


class ImageGenerationRequest(BaseModel):
    """OpenAI's image generation request; every field is honoured or refused
    (``fields.py``), values outside the API's domain are a 400 naming the
    field; any other name is refused as not a field of the route
    (``fields.py``)."""

    model_config = ConfigDict(extra="allow", **_NO_OTHER_FIELDS)

    prompt: str
    model: str | None = None
    n: PositiveInt64 = 1
    size: str = "256x256"
    seed: Int64 | None = None
    response_format: Literal["b64_json"] = "b64_json"
    user: str | None = None
    safety_identifier: str | None = None
    quality: Quality = "auto"
    style: Literal["vivid", "natural"] | None = None
    background: Background = "auto"
    moderation: Literal["low", "auto"] = "auto"
    output_format: OutputFormat = "png"
    output_compression: int | None = Field(default=None, ge=0, le=100)
    stream: bool = False
    partial_images: int | None = Field(default=None, ge=0, le=3)
    sampling_params_list: SamplingParamsList | None = sampling_params_list_field()
    # vllm-omni 0.30's image fields, each refused by name (``fields.py``).
    bot_task: str | None = None
    layers: int | None = None
    negative_prompt: str | None = None
    system_prompt: str | None = None
    use_system_prompt: str | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    flow_shift: float | None = None
    extra_params: dict[str, Any] | None = None
    generator_device: str | None = None
    lora: dict[str, Any] | None = None
    vae_use_slicing: bool = False
    vae_use_tiling: bool = False
    return_stage_metrics: bool | None = None


# -- videos ------------------------------------------------------------------------

VIDEO_MAX_PROMPT_CHARS = 32_000
_VIDEO_FIELDS = ("prompt", "model", "seconds", "size")
VIDEO_VARIANTS = ("video", "thumbnail", "spritesheet")
VIDEO_DEFAULT_PAGE = 20
VIDEO_MAX_PAGE = 100

# vllm-omni 0.30's create fields (its ``protocol/videos.py`` and video form):
# name → the JSON type of its value and its default (``None``: none). Each is
# honoured or refused by name (``fields.py``); a value equal to the default
# is not "set" (``VIDEO_DEFAULTS``; a form gives it as JSON text, "false").
_VIDEO_030: dict[str, tuple[str, Any]] = {
    "user": ("string", None),
    "width": ("integer", None),
    "height": ("integer", None),
    "fps": ("number", None),
    "seed": ("integer", None),
    "num_frames": ("integer", None),
    "video_params": ("object", None),
    "image_reference": ("object", None),
    "video_reference": ("object", None),
    "audio_reference": ("object", None),
    "control_type": ("string", None),
    "aspect_ratio": ("string", None),
    "short_edge": ("integer", None),
    "num_outputs_per_prompt": ("integer", 1),
    "start_time_seconds": ("number", None),
    "quality": ("string", None),
    "negative_prompt": ("string", None),
    "num_inference_steps": ("integer", None),
    "guidance_scale": ("number", None),
    "guidance_scale_2": ("number", None),
    "boundary_ratio": ("number", None),
    "flow_shift": ("number", None),
    "true_cfg_scale": ("number", None),
    "generate_sound": ("boolean", False),
    "sound_duration": ("number", None),
    "enable_frame_interpolation": ("boolean", False),
    "frame_interpolation_exp": ("integer", 1),
    "frame_interpolation_scale": ("number", 1.0),
    "frame_interpolation_model_path": ("string", None),
    "lora": ("object", None),
    "extra_params": ("object", None),
    "return_stage_metrics": ("boolean", None),
}
VIDEO_DEFAULTS: dict[str, Any] = {
    name: default for name, (_, default) in _VIDEO_030.items() if default is not None
}


def _json_030(kind: str, default: Any) -> dict[str, Any]:
    # 0.30 takes an image, video or audio reference as an object or a list.
    types = [kind, "array"] if kind == "object" else [kind]
    schema: dict[str, Any] = {"type": [*types, "null"]}
    return schema if default is None else {**schema, "default": default}


def _form_030(default: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    return schema if default is None else {**schema, "default": json.dumps(default)}


# What the routes read, for ``/openapi.json`` (``openapi/`` narrows the
# create fields to the pipeline). A form carries strings only (the list as
# JSON text); JSON may also give ``seconds`` as a number, and null for an
# optional field.
_FORM_FIELDS: dict[str, Any] = {
    **{name: {"type": "string"} for name in _VIDEO_FIELDS},
    "sampling_params_list": {
        "type": "string",
        "description": f"{SAMPLING_PARAMS_LIST_DESCRIPTION} In a form: JSON text.",
    },
    **{name: _form_030(default) for name, (_, default) in _VIDEO_030.items()},
}
_JSON_FIELDS: dict[str, Any] = {
    "prompt": {"type": "string"},
    "model": {"type": ["string", "null"]},
    "seconds": {"type": ["number", "string", "null"]},
    "size": {"type": ["string", "null"]},
    "sampling_params_list": {
        "type": ["array", "null"],
        "description": SAMPLING_PARAMS_LIST_DESCRIPTION,
    },
    **{name: _json_030(*spec) for name, spec in _VIDEO_030.items()},
}
VIDEO_CREATE_BODY = {
    "required": True,
    "content": {
        media_type: {
            "schema": {
                "type": "object",
                "required": ["prompt"],
                "additionalProperties": False,
                "properties": dict(
                    _JSON_FIELDS if media_type == "application/json" else _FORM_FIELDS
                ),
            }
        }
        for media_type in ("application/json", *FORM_TYPES)
    },
}
VIDEO_PAGE_PARAMETERS = [
    {
        "name": "limit",
        "in": "query",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": VIDEO_MAX_PAGE,
            "default": VIDEO_DEFAULT_PAGE,
        },
    },
    {
        "name": "order",
        "in": "query",
        "schema": {"enum": ["asc", "desc"], "default": "desc"},
    },
    {
        "name": "after",
        "in": "query",
        "description": "The id of a listed video job (404 otherwise).",
        "schema": {"type": "string"},
    },
]
VIDEO_VARIANT_PARAMETER = {
    "name": "variant",
    "in": "query",
    "schema": {"enum": list(VIDEO_VARIANTS), "default": "video"},
}
