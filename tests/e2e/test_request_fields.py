"""A 200 means the request was honoured (docs/design.md §10), field by field.

Every field of each route's request model is sent alone (with what it needs
to mean something) to the reference pipeline: it is honoured, and its effect
is visible in the response, or it is a 400 ``BadRequestError`` whose
``param`` is exactly that field. The field lists come from the models
themselves (upstream's for chat and completions), so a field that a new
upstream release adds fails here until it has a case. The docs table of
``docs/serving.md`` is the code's table (``fields.markdown``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.e2e.omni_server import OmniServer
from vllm_omni.entrypoints.openai import fields
from vllm_omni.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageGenerationRequest,
    SpeechRequest,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SPEECH = "/v1/audio/speech"
GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"
SERVING = Path(__file__).resolve().parents[2] / "docs" / "serving.md"

Check = Callable[[httpx.Response], None]


def _json(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _content(response: httpx.Response, index: int = 0) -> str:
    return str(_json(response)["choices"][index]["message"]["content"])


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [
        line[6:] for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


GREEDY = "You said: hello world"


def _greedy(response: httpx.Response) -> None:
    assert _content(response) == GREEDY


# -- chat: fields honoured by the reference pipeline, with their effect --------

CHAT_HONOURED: dict[str, tuple[dict[str, Any], Check]] = {
    "messages": ({}, _greedy),
    "model": ({"model": "omni-reference"}, _greedy),
    "max_tokens": (
        {"max_tokens": 2},
        lambda r: (
            (
                _content(r) == "You said:"
                and _json(r)["choices"][0]["finish_reason"] == "length"
            )
            or pytest.fail(r.text)
        ),
    ),
    "max_completion_tokens": (
        {"max_completion_tokens": 3, "max_tokens": 1},
        lambda r: _content(r) == "You said: hello" or pytest.fail(r.text),
    ),
    "temperature": (
        {"temperature": 1.5},
        lambda r: _content(r) != GREEDY or pytest.fail(r.text),
    ),
    "seed": (
        {"seed": 11, "temperature": 1.0},
        lambda r: _content(r) == _SEEDED or pytest.fail(r.text),
    ),
    "stop": (
        {"stop": ["hello"]},
        lambda r: (
            (
                _content(r) == "You said: "
                and _json(r)["choices"][0]["finish_reason"] == "stop"
            )
            or pytest.fail(r.text)
        ),
    ),
    "n": (
        {"n": 2, "temperature": 1.0, "seed": 3},
        lambda r: (
            (
                [c["index"] for c in _json(r)["choices"]] == [0, 1]
                and _content(r, 0) != _content(r, 1)
            )
            or pytest.fail(r.text)
        ),
    ),
    "stream": (
        {"stream": True},
        lambda r: (
            "".join(e["choices"][0]["delta"].get("content", "") for e in _events(r))
            == GREEDY
            or pytest.fail(r.text)
        ),
    ),
    "stream_options": (
        {"stream": True, "stream_options": {"include_usage": True}},
        lambda r: (
            _events(r)[-1]["usage"]["completion_tokens"] == 4 or pytest.fail(r.text)
        ),
    ),
    # An end-user id for the operator: accepted; by definition no effect.
    "user": ({"user": "user-42"}, _greedy),
    "safety_identifier": ({"safety_identifier": "user-42"}, _greedy),
    "modalities": (
        {"modalities": ["text", "audio"]},
        lambda r: (
            _json(r)["choices"][0]["message"]["audio"]["data"] or pytest.fail(r.text)
        ),
    ),
    "audio": (
        {"modalities": ["text", "audio"], "audio": {"voice": "nova"}},
        lambda r: (
            _json(r)["choices"][0]["message"]["audio"]["data"] != _ALLOY
            or pytest.fail(r.text)
        ),
    ),
    # Entry i configures stage i; stage 1 is the thinker.
    "sampling_params_list": (
        {"sampling_params_list": [None, {"max_tokens": 2}]},
        lambda r: _content(r) == "You said:" or pytest.fail(r.text),
    ),
    # vllm-omni's voice fields: the talker's voice, as audio.voice.
    "voice": (
        {"modalities": ["text", "audio"], "voice": "nova"},
        lambda r: _audio(r) == _NOVA or pytest.fail(r.text),
    ),
    "speaker": (
        {"modalities": ["text", "audio"], "speaker": "nova"},
        lambda r: _audio(r) == _NOVA or pytest.fail(r.text),
    ),
}
_SEEDED = ""  # filled by the fixture: the reply at seed 11, temperature 1
_ALLOY = ""  # filled by the fixture: the audio with the default voice
_NOVA = ""  # filled by the fixture: the audio with audio.voice "nova"


def _audio(response: httpx.Response) -> str:
    return str(_json(response)["choices"][0]["message"]["audio"]["data"])


# -- chat: fields refused by the reference pipeline (value → the param) --------

CHAT_REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "frequency_penalty": ({"frequency_penalty": 0.5}, "frequency_penalty"),
    "logit_bias": ({"logit_bias": {"1": 1}}, "logit_bias"),
    "logprobs": ({"logprobs": True}, "logprobs"),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    "presence_penalty": ({"presence_penalty": 0.5}, "presence_penalty"),
    "response_format": (
        {"response_format": {"type": "json_object"}},
        "response_format",
    ),
    "top_p": ({"top_p": 0.5}, "top_p"),
    "tools": (
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {}}}
            ],
            "tool_choice": "none",
        },
        "tools",
    ),
    "tool_choice": (
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {}}}
            ],
            "tool_choice": "auto",
        },
        "tools",
    ),
    "reasoning_effort": ({"reasoning_effort": "low"}, "reasoning_effort"),
    "thinking_token_budget": ({"thinking_token_budget": 8}, "thinking_token_budget"),
    "include_reasoning": ({"include_reasoning": False}, "include_reasoning"),
    "parallel_tool_calls": ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    "use_beam_search": ({"use_beam_search": True}, "use_beam_search"),
    "top_k": ({"top_k": 5}, "top_k"),
    "min_p": ({"min_p": 0.1}, "min_p"),
    "repetition_penalty": ({"repetition_penalty": 1.1}, "repetition_penalty"),
    "watermarking": ({"watermarking": True}, "watermarking"),
    "length_penalty": ({"length_penalty": 2.0}, "length_penalty"),
    "stop_token_ids": ({"stop_token_ids": [1]}, "stop_token_ids"),
    "include_stop_str_in_output": (
        {"include_stop_str_in_output": True},
        "include_stop_str_in_output",
    ),
    "ignore_eos": ({"ignore_eos": True}, "ignore_eos"),
    "min_tokens": ({"min_tokens": 1}, "min_tokens"),
    "skip_special_tokens": ({"skip_special_tokens": False}, "skip_special_tokens"),
    "spaces_between_special_tokens": (
        {"spaces_between_special_tokens": False},
        "spaces_between_special_tokens",
    ),
    "truncate_prompt_tokens": ({"truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
    "truncation_side": ({"truncation_side": "left"}, "truncation_side"),
    "prompt_logprobs": ({"prompt_logprobs": 1}, "prompt_logprobs"),
    "logprob_token_ids": (
        {"logprobs": True, "logprob_token_ids": [1]},
        "logprobs",
    ),
    "allowed_token_ids": ({"allowed_token_ids": [1]}, "allowed_token_ids"),
    "bad_words": ({"bad_words": ["x"]}, "bad_words"),
    "echo": ({"echo": True}, "echo"),
    "add_generation_prompt": (
        {"add_generation_prompt": False},
        "add_generation_prompt",
    ),
    "continue_final_message": (
        {"continue_final_message": True, "add_generation_prompt": False},
        "add_generation_prompt",
    ),
    "add_special_tokens": ({"add_special_tokens": True}, "add_special_tokens"),
    "documents": ({"documents": [{"title": "t"}]}, "documents"),
    "chat_template": ({"chat_template": "{{ x }}"}, "chat_template"),
    "chat_template_kwargs": (
        {"chat_template_kwargs": {"a": 1}},
        "chat_template_kwargs",
    ),
    "media_io_kwargs": ({"media_io_kwargs": {"image": {}}}, "media_io_kwargs"),
    "mm_processor_kwargs": ({"mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
    "structured_outputs": (
        {"structured_outputs": {"choice": ["a", "b"]}},
        "structured_outputs",
    ),
    "priority": ({"priority": 1}, "priority"),
    "request_id": ({"request_id": "mine"}, "request_id"),
    "session_id": ({"session_id": "s1"}, "session_id"),
    "return_tokens_as_token_ids": (
        {"return_tokens_as_token_ids": True},
        "return_tokens_as_token_ids",
    ),
    "return_token_ids": ({"return_token_ids": True}, "return_token_ids"),
    "return_weight_versions": (
        {"return_weight_versions": True},
        "return_weight_versions",
    ),
    "routed_experts_prompt_start": (
        {"routed_experts_prompt_start": 1},
        "routed_experts_prompt_start",
    ),
    "return_token_offsets": ({"return_token_offsets": True}, "return_token_offsets"),
    "return_prompt_text": ({"return_prompt_text": True}, "return_prompt_text"),
    "mm_payload": ({"mm_payload": "none"}, "mm_payload"),
    "return_mm_kwargs": ({"return_mm_kwargs": True}, "return_mm_kwargs"),
    "cache_salt": ({"cache_salt": "salt"}, "cache_salt"),
    "kv_transfer_params": ({"kv_transfer_params": {"a": 1}}, "kv_transfer_params"),
    "ec_transfer_params": ({"ec_transfer_params": {"a": 1}}, "ec_transfer_params"),
    "vllm_xargs": ({"vllm_xargs": {"a": 1}}, "vllm_xargs"),
    "repetition_detection": (
        {"repetition_detection": {"max_pattern_size": 4, "min_count": 2}},
        "repetition_detection",
    ),
    "stream_interval": ({"stream_interval": 2}, "stream_interval"),
    "lora": ({"lora": "adapter"}, "lora"),
    # vllm-omni 0.30's chat extras that no reference stage honours.
    "language": ({"language": "English"}, "language"),
    "instructions": ({"instructions": "softly"}, "instructions"),
    "ref_audio": ({"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio"),
    "additional_information": (
        {"additional_information": {"speaker": ["nova"]}},
        "additional_information",
    ),
    # A nested extra_body (vllm-omni's image clients post one): each key
    # named as extra_body.<key>, with the reason the route refuses it.
    "extra_body": ({"extra_body": {"height": 1024, "seed": 42}}, "extra_body.height"),
    "height": ({"height": 1024}, "height"),
    "width": ({"width": 1024}, "width"),
    "size": ({"size": "1024x1024"}, "size"),
    "num_outputs_per_prompt": (
        {"num_outputs_per_prompt": 1},
        "num_outputs_per_prompt",
    ),
    "quality": ({"quality": "high"}, "quality"),
    "num_inference_steps": ({"num_inference_steps": 50}, "num_inference_steps"),
    "guidance_scale": ({"guidance_scale": 4.5}, "guidance_scale"),
    "guidance_scale_2": ({"guidance_scale_2": 4.5}, "guidance_scale_2"),
    "true_cfg_scale": ({"true_cfg_scale": 4.0}, "true_cfg_scale"),
    "cfg_scale": ({"cfg_scale": 4.0}, "cfg_scale"),
    "num_frames": ({"num_frames": 16}, "num_frames"),
    "layers": ({"layers": 2}, "layers"),
    "resolution": ({"resolution": 640}, "resolution"),
    "negative_prompt": ({"negative_prompt": "blurry"}, "negative_prompt"),
    "generator_device": ({"generator_device": "cpu"}, "generator_device"),
    "strength": ({"strength": 0.5}, "strength"),
    "bot_task": ({"bot_task": "think"}, "bot_task"),
    "system_prompt": ({"system_prompt": "be bold"}, "system_prompt"),
    "use_system_prompt": ({"use_system_prompt": "en_vanilla"}, "use_system_prompt"),
    "sys_type": ({"sys_type": "en_vanilla"}, "sys_type"),
    "extra_args": ({"extra_args": {"a": 1}}, "extra_args"),
    "extra_params": ({"extra_params": {"a": 1}}, "extra_params"),
    "return_stage_metrics": ({"return_stage_metrics": True}, "return_stage_metrics"),
}


@pytest.fixture(scope="module")
def http(omni_server: OmniServer) -> httpx.Client:
    return httpx.Client(
        base_url=omni_server.base_url, headers=omni_server.headers(), timeout=60
    )


@pytest.fixture(scope="module", autouse=True)
def _references(http: httpx.Client) -> None:
    global _SEEDED, _ALLOY, _NOVA
    _SEEDED = _content(http.post(CHAT, json=_chat({"seed": 11, "temperature": 1.0})))
    assert _SEEDED != GREEDY
    _ALLOY = _audio(http.post(CHAT, json=_chat({"modalities": ["text", "audio"]})))
    nova = {"modalities": ["text", "audio"], "audio": {"voice": "nova"}}
    _NOVA = _audio(http.post(CHAT, json=_chat(nova)))
    assert _NOVA != _ALLOY


def _chat(extra: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hello world"}], **extra}


def _refused(response: httpx.Response, param: str) -> None:
    assert response.status_code == 400, (param, response.text)
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", param)


def test_every_chat_field_has_a_case() -> None:
    assert set(CHAT_HONOURED) | set(CHAT_REFUSED) == set(
        ChatCompletionRequest.model_fields
    )
    assert not set(CHAT_HONOURED) & set(CHAT_REFUSED)


@pytest.mark.parametrize("name", sorted(CHAT_HONOURED))
def test_a_chat_field_is_honoured(http: httpx.Client, name: str) -> None:
    extra, check = CHAT_HONOURED[name]
    check(http.post(CHAT, json=_chat(extra)))


@pytest.mark.parametrize("name", sorted(CHAT_REFUSED))
def test_a_chat_field_is_refused(http: httpx.Client, name: str) -> None:
    extra, param = CHAT_REFUSED[name]
    _refused(http.post(CHAT, json=_chat(extra)), param)


# -- completions: the same sampling fields, on a prompt ------------------------

COMPLETION_HONOURED: dict[str, dict[str, Any]] = {
    "prompt": {},
    "model": {"model": "omni-reference"},
    "max_tokens": {"max_tokens": 2},
    "temperature": {"temperature": 1.5},
    "seed": {"seed": 11, "temperature": 1.0},
    "stop": {"stop": ["hello"]},
    "n": {"n": 2},
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "user": {"user": "user-42"},
    "sampling_params_list": {"sampling_params_list": [None, {"max_tokens": 2}]},
}


def _completion_text(response: httpx.Response) -> str:
    return str(_json(response)["choices"][0]["text"])


# Completion fields refused with a case of their own (only completions have
# them, or their default differs from chat's); the others use chat's case.
COMPLETION_REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "logprobs": ({"logprobs": 2}, "logprobs"),
    "suffix": ({"suffix": "end"}, "suffix"),
    "prompt_embeds": ({"prompt_embeds": "AAAA"}, "prompt_embeds"),
    "add_special_tokens": ({"add_special_tokens": False}, "add_special_tokens"),
}


def test_every_completion_field_has_a_case() -> None:
    refused = {
        name
        for name in CompletionRequest.model_fields
        if name not in COMPLETION_HONOURED
    }
    assert refused <= set(CHAT_REFUSED) | set(COMPLETION_REFUSED)


def test_completion_fields_are_honoured(http: httpx.Client) -> None:
    def post(extra: dict[str, Any]) -> httpx.Response:
        return http.post(COMPLETIONS, json={"prompt": "hello world", **extra})

    assert _completion_text(post({})) == GREEDY
    assert _completion_text(post({"model": "omni-reference", "user": "u"})) == GREEDY
    short = _json(post({"max_tokens": 2}))["choices"][0]
    assert (short["text"], short["finish_reason"]) == ("You said:", "length")
    assert _completion_text(post({"temperature": 1.5})) != GREEDY
    seeded = _completion_text(post({"seed": 11, "temperature": 1.0}))
    assert seeded == _SEEDED
    stopped = _json(post({"stop": ["hello"]}))["choices"][0]
    assert (stopped["text"], stopped["finish_reason"]) == ("You said: ", "stop")
    assert [c["index"] for c in _json(post({"n": 2}))["choices"]] == [0, 1]
    events = _events(post({"stream": True, "stream_options": {"include_usage": True}}))
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == GREEDY
    assert events[-1]["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name in CompletionRequest.model_fields
        if name not in COMPLETION_HONOURED
    ),
)
def test_a_completion_field_is_refused(http: httpx.Client, name: str) -> None:
    extra, param = COMPLETION_REFUSED.get(name) or CHAT_REFUSED[name]
    response = http.post(COMPLETIONS, json={"prompt": "hello world", **extra})
    _refused(response, param)


def test_batched_and_token_prompts_are_refused(http: httpx.Client) -> None:
    for prompt in (["a", "b"], [1, 2, 3], [[1, 2]]):
        _refused(http.post(COMPLETIONS, json={"prompt": prompt}), "prompt")


# -- speech, images: OpenAI's fields ---------------------------------------------


def test_speech_fields(http: httpx.Client) -> None:
    # ``speaker`` is the voice's alias.
    assert set(SpeechRequest.model_fields) | {"speaker"} == set(fields.SPEECH)
    base = {"input": "hello world"}
    alloy = http.post(SPEECH, json=base)
    assert alloy.status_code == 200
    nova = http.post(SPEECH, json={**base, "voice": "nova"})
    fast = http.post(SPEECH, json={**base, "speed": 2.0})
    assert nova.status_code == fast.status_code == 200
    assert nova.content != alloy.content
    assert len(fast.content) < len(alloy.content)
    assert http.post(SPEECH, json={**base, "model": "omni-reference"}).content == (
        alloy.content
    )
    assert http.post(SPEECH, json={**base, "stream_format": "audio"}).content == (
        alloy.content
    )
    _refused(http.post(SPEECH, json={**base, "instructions": "softly"}), "instructions")
    _refused(http.post(SPEECH, json={**base, "stream_format": "sse"}), "stream_format")
    _refused(
        http.post(SPEECH, json={**base, "response_format": "mp3"}), "response_format"
    )


# vllm-omni 0.30's speech fields (its protocol/audio.py), as its clients send
# them: each refused by name.
SPEECH_030: dict[str, Any] = {
    "stream": True,
    "sample_rate": 24000,
    "task_type": "CustomVoice",
    "language": "English",
    "ref_audio": "data:audio/wav;base64,AAAA",
    "ref_text": "hello",
    "ref_audio_2": "data:audio/wav;base64,AAAA",
    "ambient_sound": "rain",
    "duration_seconds": 2.0,
    "x_vector_only_mode": True,
    "speaker_embedding": [0.1, 0.2],
    "max_new_tokens": 64,
    "seed": 1,
    "initial_codec_chunk_frames": 4,
    "non_streaming_mode": True,
    "extra_params": {"a": 1},
    "word_timestamps": True,
}


def test_vllm_omni_speech_fields(http: httpx.Client) -> None:
    base = {"input": "hello world"}
    nova = http.post(SPEECH, json={**base, "voice": "nova"})
    speaker = http.post(SPEECH, json={**base, "speaker": "nova"})
    assert speaker.status_code == 200 and speaker.content == nova.content
    assert http.post(SPEECH, json={**base, "speaker": "nobody"}).status_code == 404
    assert set(SPEECH_030) < set(SpeechRequest.model_fields)
    for name, value in SPEECH_030.items():
        _refused(http.post(SPEECH, json={**base, name: value}), name)
    # Their defaults are not "set": a client that sends them is honoured.
    off = {"stream": False, "word_timestamps": False, "seed": None}
    honoured = http.post(SPEECH, json={**base, **off})
    assert honoured.status_code == 200, honoured.text


# vllm-omni 0.30's image generation fields (its protocol/images.py): each
# refused by name.
IMAGES_030: dict[str, Any] = {
    "bot_task": "think",
    "layers": 2,
    "negative_prompt": "blurry",
    "system_prompt": "be bold",
    "use_system_prompt": "yes",
    "num_inference_steps": 20,
    "guidance_scale": 4.5,
    "true_cfg_scale": 4.0,
    "flow_shift": 3.0,
    "extra_params": {"a": 1},
    "generator_device": "cpu",
    "lora": {"name": "a"},
    "vae_use_slicing": True,
    "vae_use_tiling": True,
    "return_stage_metrics": True,
}


def test_vllm_omni_image_fields(http: httpx.Client) -> None:
    base = {"prompt": "a red square"}
    assert set(IMAGES_030) < set(ImageGenerationRequest.model_fields)
    for name, value in IMAGES_030.items():
        _refused(http.post(GENERATIONS, json={**base, name: value}), name)
    off = {"vae_use_slicing": False, "negative_prompt": None}
    honoured = http.post(GENERATIONS, json={**base, **off})
    assert honoured.status_code == 200, honoured.text


def _image(response: httpx.Response) -> Image.Image:
    import base64

    data = _json(response)["data"]
    return Image.open(io.BytesIO(base64.b64decode(data[0]["b64_json"])))


IMAGE_REFUSED: dict[str, Any] = {
    "quality": "hd",
    "style": "vivid",
    "background": "transparent",
    "moderation": "low",
    "output_format": "jpeg",
    "output_compression": 50,
    "stream": True,
    "partial_images": 1,
    # The OpenAI API's newer fields, which the request model does not define.
    "complexity": "low",
    "frame_count": 4,
    "frame_duration_ms": 100,
    "svg": {"model": "x"},
}


def test_image_generation_fields(http: httpx.Client) -> None:
    base = {"prompt": "a red fox", "size": "64x64"}
    assert _image(http.post(GENERATIONS, json=base)).size == (64, 64)
    assert len(_json(http.post(GENERATIONS, json={**base, "n": 2}))["data"]) == 2
    seeded = [
        _json(http.post(GENERATIONS, json={**base, "seed": seed}))["data"][0]
        for seed in (1, 1, 2)
    ]
    assert seeded[0] == seeded[1] != seeded[2]
    accepted = {
        "user": "u",
        "safety_identifier": "u",
        "model": "omni-reference",
        "response_format": "b64_json",
    }
    for name, value in accepted.items():
        assert http.post(GENERATIONS, json={**base, name: value}).status_code == 200
    # The model's fields, and the OpenAI API's that it does not define.
    assert set(ImageGenerationRequest.model_fields) | {
        "safety_identifier",
        *IMAGE_REFUSED,
    } == set(fields.IMAGE_GENERATIONS)
    for name, value in IMAGE_REFUSED.items():
        _refused(http.post(GENERATIONS, json={**base, name: value}), name)
    # Outside the API's domain: a 400 naming the field too.
    _refused(http.post(GENERATIONS, json={**base, "quality": "ultra"}), "quality")
    _refused(http.post(GENERATIONS, json={**base, "style": "loud"}), "style")


def test_image_edit_fields(http: httpx.Client) -> None:
    png = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(png, format="PNG")
    files = {"image": ("in.png", png.getvalue(), "image/png")}
    base = {"prompt": "bluer", "size": "64x64"}
    assert http.post(EDITS, data=base, files=files).status_code == 200
    form_refused = {
        "quality": "hd",
        "background": "opaque",
        "output_format": "webp",
        "output_compression": "50",
        "input_fidelity": "high",
        "stream": "true",
        "partial_images": "1",
        "complexity": "low",
        "frame_count": "4",
        "frame_duration_ms": "100",
        "svg": "{}",
        "markup": "x",
    }
    for name, value in form_refused.items():
        _refused(http.post(EDITS, data={**base, name: value}, files=files), name)
    mask = {**files, "mask": ("mask.png", png.getvalue(), "image/png")}
    _refused(http.post(EDITS, data=base, files=mask), "mask")


def test_the_sdk_reads_every_choice(omni_server: OmniServer) -> None:
    client = openai.OpenAI(
        base_url=omni_server.base_url + "/v1",
        api_key=omni_server.api_key,
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model="omni-reference",
        messages=[{"role": "user", "content": "hello world"}],
        n=2,
        temperature=1.0,
        seed=3,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[1].message.content
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="omni-reference",
            messages=[{"role": "user", "content": "hi"}],
            logprobs=True,
        )
    assert info.value.body["param"] == "logprobs"  # type: ignore[index]


# -- the docs table is the code's ------------------------------------------------


def _doc_table(route: str) -> list[str]:
    text = SERVING.read_text(encoding="utf-8")
    begin, end = f"<!-- fields:{route} -->", f"<!-- /fields:{route} -->"
    assert begin in text and end in text, route
    return text.split(begin, 1)[1].split(end, 1)[0].strip().splitlines()


# Routes whose request model is upstream's: every field of the model, then
# the table's others (the OpenAI API's that upstream's model lacks).
MODEL_FIELDS = {
    route: [
        *model.model_fields,
        *(name for name in fields.ROUTES[route][0] if name not in model.model_fields),
    ]
    for route, model in (
        ("chat", ChatCompletionRequest),
        ("completions", CompletionRequest),
    )
}


@pytest.mark.parametrize("route", sorted(fields.ROUTES))
def test_the_docs_table_is_the_code(route: str) -> None:
    assert _doc_table(route) == fields.markdown(route, MODEL_FIELDS.get(route))
