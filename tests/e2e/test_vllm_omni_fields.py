"""vllm-omni 0.30's own request fields, sent as its clients send them: each
honoured or refused with its name, none ignored.

The names come from the published 0.30.0 wheel (``tests/wheel030.py``): what
its chat serving reads from a chat request, its video request model and
video form, its image edit form. A name 0.30 reads that a route's table
(``vllm_omni/entrypoints/openai/fields.py``) does not list fails here.
Requests are shaped as its ``examples/online_serving`` clients send them:
the multimodal client's voice in the official SDK's ``extra_body``, the
image chat clients' raw JSON with a nested ``extra_body``, video and edit
forms as multipart.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import time
from typing import Any

import httpx
import openai
import pytest
import requests
from PIL import Image

from tests.e2e.omni_server import OmniServer
from tests.wheel030 import parse
from vllm_omni.entrypoints.openai import fields
from vllm_omni.entrypoints.openai.protocol import UpstreamChatCompletionRequest
from vllm_omni.stages.speech import VOICES

MODEL = "omni-reference"
# 0.30's chat serving, and the module it reads a diffusion chat's extras with.
CHAT_030 = (
    "entrypoints/openai/serving_chat.py",
    "entrypoints/openai/diffusion_request_utils.py",
)
# Names 0.30's chat serving reads that are no request field (pydantic's).
_NOT_FIELDS = {"model_fields_set", "__fields_set__", "model_extra"}
_EXTRA_MAPPINGS = {
    "extra_body",
    "model_extra",
    "nested_extra_body",
    "root_args",
    "nested_args",
}


# -- the names, from the 0.30.0 wheel ---------------------------------------------


def _chat_names_030() -> set[str]:
    """Every request field name 0.30's chat serving reads: ``getattr(request,
    "x")``, ``extra_body.get("x")`` (and its ``model_extra``, root and nested
    arguments), ``extra_body["x"]``, a flag (``_truthy_extra_body_flag(request,
    "x")``), and its diffusion field sets and aliases."""
    names: set[str] = set()
    nodes = [node for relative in CHAT_030 for node in ast.walk(parse(relative))]
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("extra_body_flag")
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
        elif isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            key = node.args[1] if len(node.args) > 1 else None
            func = node.func
            if (
                isinstance(func, ast.Name)
                and func.id == "getattr"
                and isinstance(first, ast.Name)
                and first.id == "request"
                and isinstance(key, ast.Constant)
            ):
                names.add(key.value)
            elif (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and isinstance(func.value, ast.Name)
                and func.value.id in _EXTRA_MAPPINGS
                and isinstance(first, ast.Constant)
            ):
                names.add(first.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in _EXTRA_MAPPINGS
            and isinstance(node.slice, ast.Constant)
        ):
            names.add(node.slice.value)
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id.startswith("_diffusion_")
            for target in node.targets
        ):
            names |= {
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
    return {name for name in names if isinstance(name, str)} - _NOT_FIELDS


def _form_names(relative: str, function: str) -> dict[str, bool]:
    """The form fields of a 0.30 FastAPI handler (its alias where it has
    one) → whether the field is an upload."""
    for node in ast.walk(parse(relative)):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == function:
            break
    else:
        raise AssertionError(f"0.30 {relative} has no {function}")
    found: dict[str, bool] = {}
    args = node.args.args[-len(node.args.defaults) :]
    for arg, default in zip(args, node.args.defaults, strict=True):
        call = default if isinstance(default, ast.Call) else None
        alias = next(
            (
                k.value.value
                for k in (call.keywords if call else [])
                if k.arg == "alias" and isinstance(k.value, ast.Constant)
            ),
            None,
        )
        upload = "UploadFile" in ast.unparse(arg.annotation or ast.Constant(None))
        found[alias or arg.arg] = upload
    return found


def _model_fields(relative: str, name: str) -> list[str]:
    for node in ast.walk(parse(relative)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise AssertionError(f"0.30 {relative} has no {name}")


def test_every_chat_name_030_reads_has_a_rule() -> None:
    names = _chat_names_030()
    # The parse found what its example clients send (a guard on the parse).
    assert {"speaker", "height", "num_inference_steps", "extra_body"} <= names
    assert names - set(fields.CHAT) == set()


def test_every_video_field_030_has_a_rule() -> None:
    model = _model_fields(
        "entrypoints/openai/protocol/videos.py", "VideoGenerationRequest"
    )
    form = _form_names(
        "entrypoints/openai/video/generation/helpers.py", "_parse_video_form"
    )
    # An upload is refused by its name whatever it is (the route reads no file).
    named = set(model) | {name for name, upload in form.items() if not upload}
    assert named - set(fields.VIDEOS) == set()


@pytest.mark.parametrize(
    ("relative", "model", "table"),
    [
        ("protocol/images.py", "ImageGenerationRequest", fields.IMAGE_GENERATIONS),
        ("protocol/audio.py", "OpenAICreateSpeechRequest", fields.SPEECH),
    ],
    ids=["image_generations", "speech"],
)
def test_every_json_field_030_has_a_rule(
    relative: str, model: str, table: dict[str, fields.FieldRule]
) -> None:
    names = _model_fields(f"entrypoints/openai/{relative}", model)
    # speaker is voice's other name (an alias of the model's voice field).
    assert set(names) - {"speaker"} - set(table) == set()


def test_every_edit_field_030_has_a_rule() -> None:
    form = _form_names("entrypoints/openai/api_server.py", "edit_images")
    assert set(form) - {"raw_request"} - set(fields.IMAGE_EDITS) == set()


# -- chat, as the multimodal and image clients send it ----------------------------


@pytest.fixture(scope="module")
def http(omni_server: OmniServer) -> httpx.Client:
    return httpx.Client(
        base_url=omni_server.base_url, headers=omni_server.headers(), timeout=60
    )


def _messages() -> list[dict[str, Any]]:
    """The multimodal example client's system prompt and text query."""
    return [
        {
            "role": "system",
            "content": [{"type": "text", "text": "You are a helpful assistant."}],
        },
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
    ]


def _speak(client: openai.OpenAI, **kwargs: Any) -> bytes:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=_messages(),  # type: ignore[arg-type]
        modalities=["text", "audio"],
        **kwargs,
    )
    return base64.b64decode(reply.choices[0].message.audio.data)


def _param(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> Any:
    return caught.value.body["param"]  # type: ignore[index]


def test_the_speaker_sets_the_talkers_voice(client: openai.OpenAI) -> None:
    entries = [None, {"max_tokens": 16, "seed": 42}]
    nova = _speak(client, audio={"voice": "nova", "format": "wav"})
    alloy = _speak(client, extra_body={"sampling_params_list": entries})
    for name in ("speaker", "voice"):
        given = _speak(
            client, extra_body={name: "nova", "sampling_params_list": entries}
        )
        assert given == nova != alloy
    # The voice is given once: a second is a 400 on it, even the same voice.
    for audio, extra, second in (
        ({"voice": "nova", "format": "wav"}, {"speaker": "nova"}, "speaker"),
        ({"voice": "nova", "format": "wav"}, {"voice": "echo"}, "voice"),
        (None, {"voice": "nova", "speaker": "nova"}, "speaker"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            _speak(client, **({"audio": audio} if audio else {}), extra_body=extra)
        assert _param(caught) == second
    # audio without a voice of its own takes the voice or speaker given.
    wav = {"format": "wav"}
    assert _speak(client, audio=wav, extra_body={"speaker": "nova"}) == nova
    # A voice outside the talker's (as audio.voice: the document's enum).
    with pytest.raises(openai.BadRequestError) as caught:
        _speak(client, extra_body={"speaker": "nobody"})
    assert _param(caught) == "speaker"
    # A voice without audio output: nothing would speak it.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=_messages(),  # type: ignore[arg-type]
            extra_body={"speaker": "nova"},
        )
    assert _param(caught) == "speaker"


# What vllm-omni's chat clients send that no reference stage honours: one
# example value each (its image chat clients' settings, its speech fields).
CHAT_REFUSED_030: dict[str, Any] = {
    "language": "English",
    "instructions": "softly",
    "ref_audio": "data:audio/wav;base64,AAAA",
    "additional_information": {"speaker": ["nova"]},
    "height": 1024,
    "width": 1024,
    "size": "1024x1024",
    "num_outputs_per_prompt": 1,
    "quality": "high",
    "num_inference_steps": 50,
    "guidance_scale": 4.5,
    "guidance_scale_2": 4.5,
    "true_cfg_scale": 4.0,
    "cfg_scale": 4.0,
    "num_frames": 16,
    "layers": 2,
    "resolution": 640,
    "negative_prompt": "blurry",
    "generator_device": "cpu",
    "strength": 0.5,
    "bot_task": "think",
    "system_prompt": "be bold",
    "use_system_prompt": "en_vanilla",
    "sys_type": "en_vanilla",
    "extra_args": {"a": 1},
    "extra_params": {"a": 1},
    "return_stage_metrics": True,
}


def test_every_chat_field_030_is_honoured_or_refused() -> None:
    """Upstream's own fields (``seed``, ``documents``, ...) are in the chat
    table's upstream cases (``test_request_fields.py``); these are 0.30's."""
    own = _chat_names_030() - set(UpstreamChatCompletionRequest.model_fields)
    refused = {name for name in own if not fields.CHAT[name].honoured_by}
    assert refused == set(CHAT_REFUSED_030)
    assert own - refused == {
        "voice",
        "speaker",
        "extra_body",
        "modalities",
        "audio",
        "lora",
    }


@pytest.mark.parametrize("name", sorted(CHAT_REFUSED_030))
def test_a_chat_field_030_is_refused_by_name(client: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=_messages(),  # type: ignore[arg-type]
            extra_body={name: CHAT_REFUSED_030[name]},
        )
    assert _param(caught) == name
    assert "cannot be honoured" in caught.value.message


def test_the_image_chat_clients_are_refused_by_name(
    omni_server: OmniServer, client: openai.OpenAI
) -> None:
    """Its text-to-image chat client posts raw JSON with a nested
    ``extra_body``; through the SDK, the same settings land at the top level."""
    settings = {
        "height": 1024,
        "width": 1024,
        "num_inference_steps": 50,
        "true_cfg_scale": 4.0,
        "seed": 42,
        "num_outputs_per_prompt": 1,
    }
    payload = {
        "messages": [{"role": "user", "content": "a cup of coffee on the table"}],
        "extra_body": settings,
    }
    raw = requests.post(
        f"{omni_server.base_url}/v1/chat/completions",
        headers={"Content-Type": "application/json", **omni_server.headers()},
        json=payload,
        timeout=60,
    )
    assert raw.status_code == 400, raw.text
    assert raw.json()["error"]["param"] == "extra_body.height"
    # A nested key the route honours at the top level: read there only.
    nested_seed = requests.post(
        f"{omni_server.base_url}/v1/chat/completions",
        headers=omni_server.headers(),
        json={**payload, "extra_body": {"seed": 42}},
        timeout=60,
    )
    assert nested_seed.status_code == 400
    assert nested_seed.json()["error"]["param"] == "extra_body.seed"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=payload["messages"],  # type: ignore[arg-type]
            extra_body=settings,
        )
    assert _param(caught) == "height"


# -- video jobs, as 0.30's video form and JSON clients send them -------------------


def _job(http: httpx.Client, **kwargs: Any) -> httpx.Response:
    return http.post("/v1/videos", **kwargs)


def _gif(http: httpx.Client, created: httpx.Response) -> Image.Image:
    assert created.status_code == 200, created.text
    video_id = created.json()["id"]
    deadline = time.monotonic() + 30
    while (status := http.get(f"/v1/videos/{video_id}").json()["status"]) in (
        "queued",
        "in_progress",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert status == "completed"
    content = http.get(f"/v1/videos/{video_id}/content")
    return Image.open(io.BytesIO(content.content))


def test_video_fields_030_are_honoured(http: httpx.Client) -> None:
    form = {
        "prompt": "waves",
        "seconds": "1",
        "width": "64",
        "height": "128",
        "fps": "4",
        "seed": "7",
        "user": "user-42",
    }
    with _gif(http, _job(http, data=form)) as gif:
        assert (gif.size, gif.n_frames) == ((64, 128), 4)
        first = gif.convert("RGB").tobytes()
    # JSON as 0.30's model types it (fps a number), the defaults sent as such.
    body = {
        **form,
        "width": 64,
        "height": 128,
        "fps": 4.0,
        "seed": 7,
        "num_outputs_per_prompt": 1,
        "generate_sound": False,
        "enable_frame_interpolation": False,
    }
    with _gif(http, _job(http, json=body)) as gif:
        assert gif.convert("RGB").tobytes() == first
    with _gif(http, _job(http, json={**body, "seed": 8})) as gif:
        assert gif.convert("RGB").tobytes() != first


# 0.30's video fields no reference stage honours, with a value a client sends.
VIDEO_REFUSED_030: dict[str, Any] = {
    "num_frames": 16,
    "video_params": {"fps": 8},
    "image_reference": {"image_url": "https://example.com/a.png"},
    "video_reference": {"video_url": "https://example.com/a.mp4"},
    "audio_reference": {"audio_url": "https://example.com/a.wav"},
    "control_type": "depth",
    "aspect_ratio": "16:9",
    "short_edge": 480,
    "num_outputs_per_prompt": 2,
    "start_time_seconds": 1.0,
    "quality": "high",
    "negative_prompt": "blurry",
    "num_inference_steps": 20,
    "guidance_scale": 4.0,
    "guidance_scale_2": 3.0,
    "boundary_ratio": 0.875,
    "flow_shift": 5.0,
    "true_cfg_scale": 4.0,
    "generate_sound": True,
    "sound_duration": 2.0,
    "enable_frame_interpolation": True,
    "frame_interpolation_exp": 2,
    "frame_interpolation_scale": 0.5,
    "frame_interpolation_model_path": "elfgum/RIFE-4.22.lite",
    "lora": {"name": "a", "path": "/tmp/a"},
    "extra_params": {"a": 1},
    "return_stage_metrics": True,
}


def test_every_refused_video_field_has_a_case() -> None:
    # input_reference is the OpenAI API's (tests/e2e/test_unknown_fields.py).
    assert set(VIDEO_REFUSED_030) | {"input_reference"} == {
        name for name, rule in fields.VIDEOS.items() if not rule.honoured_by
    }


@pytest.mark.parametrize("name", sorted(VIDEO_REFUSED_030))
def test_a_video_field_030_is_refused_by_name(http: httpx.Client, name: str) -> None:
    value = VIDEO_REFUSED_030[name]
    as_text = value if isinstance(value, str) else json.dumps(value)
    for given in (
        {"json": {"prompt": "waves", name: value}},
        {"data": {"prompt": "waves", name: as_text}},
    ):
        response = _job(http, **given)
        assert response.status_code == 400, (given, response.text)
        error = response.json()["error"]
        assert error["param"] == name and "cannot be honoured" in error["message"]


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ({"width": "64"}, "height"),
        ({"width": "64", "height": "64", "size": "64x64"}, "width"),
        ({"width": "65", "height": "64"}, "width"),
        ({"width": "64", "height": "4096"}, "height"),
        ({"fps": "99"}, "fps"),
        ({"fps": "fast"}, "fps"),
        ({"seed": "-1"}, "seed"),
    ],
)
def test_video_fields_030_outside_the_stage_are_refused(
    http: httpx.Client, given: dict[str, str], param: str
) -> None:
    response = _job(http, data={"prompt": "waves", **given})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# -- image edits, as 0.30's edit form -----------------------------------------------


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(buffer, format="PNG")
    return buffer.getvalue()


EDIT_REFUSED_030: dict[str, str] = {
    "negative_prompt": "blurry",
    "num_inference_steps": "20",
    "guidance_scale": "4.5",
    "guidance_scale_2": "3.0",
    "strength": "0.5",
    "true_cfg_scale": "4.0",
    "generator_device": "cpu",
    "lora": '{"name": "a"}',
    "layers": "2",
    "resolution": "640",
    "bot_task": "think",
    "sys_type": "en_vanilla",
    "system_prompt": "be bold",
    "return_stage_metrics": "true",
    "url": "https://example.com/a.png",
    "url[]": "https://example.com/a.png",
}
EDIT_UPLOADS_030 = ("mask_image", "reference_image", "image[]")


def test_every_refused_edit_field_has_a_case() -> None:
    # The OpenAI API's form fields that the route reads as given too
    # (tests/e2e/test_request_fields.py::test_image_edit_fields).
    openai_names = {"complexity", "frame_count", "frame_duration_ms", "svg", "markup"}
    assert set(EDIT_REFUSED_030) | set(EDIT_UPLOADS_030) | openai_names == set(
        fields.IMAGE_EDITS_030
    )


def test_edit_fields_030(http: httpx.Client) -> None:
    files = {"image": ("in.png", _png(), "image/png")}
    base = {"prompt": "bluer", "size": "64x64"}

    def edit(**given: str) -> str:
        response = http.post("/v1/images/edits", data={**base, **given}, files=files)
        assert response.status_code == 200, response.text
        return str(response.json()["data"][0]["b64_json"])

    assert edit(seed="1") == edit(seed="1") != edit(seed="2")
    for name, value in EDIT_REFUSED_030.items():
        response = http.post(
            "/v1/images/edits", data={**base, name: value}, files=files
        )
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"]["param"] == name
    for name in EDIT_UPLOADS_030:
        upload = {**files, name: ("x.png", _png(), "image/png")}
        response = http.post("/v1/images/edits", data=base, files=upload)
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"]["param"] == name


# -- /openapi.json ------------------------------------------------------------------


def chat_schema_rules(document: dict[str, Any]) -> bool:
    """The chat body's cross-field rules: a voice given once, and a nested
    extra_body that carries nothing."""
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    rules = json.dumps(chat["allOf"])
    nested = chat["properties"]["extra_body"]["anyOf"][0]
    return '"speaker": {"type": "null"}' in rules and nested == {
        "type": "object",
        "additionalProperties": {"type": "null"},
    }


def test_openapi_describes_the_030_fields(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    for name in ("voice", "speaker"):
        assert chat[name]["anyOf"][0]["enum"] == sorted(VOICES)
    assert chat["negative_prompt"]["enum"] == [None]
    assert "images and video come from" in chat["negative_prompt"]["description"]
    create = document["paths"]["/v1/videos"]["post"]["requestBody"]["content"]
    body = create["application/json"]["schema"]["properties"]
    assert body["fps"]["anyOf"][0]["maximum"] == 30
    assert body["width"]["anyOf"][0]["multipleOf"] == 8
    assert body["generate_sound"]["enum"] == [None, False]
    form = create["multipart/form-data"]["schema"]
    assert "pattern" in form["properties"]["seed"]
    assert form["properties"]["num_frames"] is False
    assert form["properties"]["sampling_params_list"]["format"] == "json"
    assert form["allOf"][1]["then"]["required"] == ["width"]
    assert chat_schema_rules(document)
    edits = document["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    ref = edits["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[-1]
    edit_form = document["components"]["schemas"][ref]["properties"]
    assert "refused" in json.dumps(edit_form["negative_prompt"]).lower()
    assert "JSON text" in edit_form["sampling_params_list"]["anyOf"][0]["description"]
