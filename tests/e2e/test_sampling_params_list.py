"""vllm-omni's ``sampling_params_list``, sent as its example clients send it.

Requests are shaped like vllm-omni's ``examples/online_serving`` multimodal
client (a system prompt and a user message of text content parts, the list
in the official SDK's ``extra_body``), against the reference pipeline (stage
0 the guardrail, 1 the thinker, 2 the talker, 3 the vocoder, 4 image, 5
video). Entry *i* changes what stage *i* does, or the request is a 400
whose ``param`` is the entry's exact place: never a 200 that ignored it.
"""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from tests.e2e.omni_server import OmniServer

MODEL = "omni-reference"
SEED = 42
PROMPT = "Explain the system architecture for a scalable audio pipeline."
# What the greedy reference thinker answers, word by word ("You said: ...").
REPLY_WORDS = 2 + len(PROMPT.split())


def _messages() -> list[dict[str, Any]]:
    """The example client's system prompt and text query (content parts)."""
    return [
        {
            "role": "system",
            "content": [{"type": "text", "text": "You are a helpful assistant."}],
        },
        {"role": "user", "content": [{"type": "text", "text": PROMPT}]},
    ]


def _thinker(**overrides: Any) -> dict[str, Any]:
    """The example's thinker entry, with the keys the reference thinker reads."""
    return {"temperature": 0.0, "max_tokens": 2048, "seed": SEED, **overrides}


def _chat(client: openai.OpenAI, entries: Any, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=_messages(),  # type: ignore[arg-type]
        extra_body={"sampling_params_list": entries},
        **kwargs,
    )


def test_the_thinker_entry_bounds_the_completion(client: openai.OpenAI) -> None:
    whole = _chat(client, [None, _thinker()])
    assert whole.usage.completion_tokens > 2
    short = _chat(client, [{}, _thinker(max_tokens=2)])
    assert short.usage.completion_tokens == 2
    assert short.choices[0].finish_reason == "length"
    assert short.choices[0].message.content == "You said:"


def test_the_thinker_entry_samples(client: openai.OpenAI) -> None:
    greedy = _chat(client, [None, _thinker()]).choices[0].message.content
    sampled = _chat(client, [None, _thinker(temperature=1.0)])
    again = _chat(client, [None, _thinker(temperature=1.0)])
    assert sampled.choices[0].message.content != greedy
    assert again.choices[0].message.content == sampled.choices[0].message.content


@pytest.mark.parametrize(
    "top_level",
    [{"max_tokens": 9}, {"max_completion_tokens": 9}, {"temperature": 1.0}],
    ids=["max_tokens", "max_completion_tokens", "temperature"],
)
def test_the_entry_wins_over_the_top_level_field(
    client: openai.OpenAI, top_level: dict[str, Any]
) -> None:
    reply = _chat(client, [None, _thinker(max_tokens=2)], **top_level)
    assert reply.usage.completion_tokens == 2
    assert reply.choices[0].message.content == "You said:"


@pytest.mark.parametrize(
    ("route", "top_level"),
    [
        ("chat", {"max_tokens": 0}),
        ("chat", {"max_completion_tokens": -1}),
        ("completions", {"max_tokens": 0}),
        ("chat", {"temperature": 9.0}),
    ],
    ids=["chat-max_tokens", "chat-max_completion_tokens", "completions", "temperature"],
)
def test_a_top_level_value_the_entry_replaces_is_still_checked(
    client: openai.OpenAI, route: str, top_level: dict[str, Any]
) -> None:
    """Found by the OpenAPI fuzz: ``max_tokens: 0`` beside an entry that sets
    the thinker's ``max_tokens`` was a 200. The request's own value is the
    same 400 as without the list, naming the request's field: never ignored."""
    entries = [{}, _thinker(max_tokens=5)]
    with pytest.raises(openai.BadRequestError) as info:
        if route == "chat":
            _chat(client, entries, **top_level)
        else:
            client.completions.create(
                model=MODEL,
                prompt=PROMPT,
                extra_body={"sampling_params_list": entries},
                **top_level,
            )
    body = info.value.body
    assert body["param"] == next(iter(top_level))  # type: ignore[index]
    assert body["code"] == 400  # type: ignore[index]


def test_a_top_level_field_the_entry_does_not_set_still_applies(
    client: openai.OpenAI,
) -> None:
    reply = _chat(client, [None, {"seed": SEED}], max_tokens=3)
    assert reply.usage.completion_tokens == 3


def test_the_talker_entry_sets_the_voice(client: openai.OpenAI) -> None:
    def audio(entries: Any) -> bytes:
        reply = _chat(client, entries, modalities=["text", "audio"])
        return base64.b64decode(reply.choices[0].message.audio.data)

    alloy = audio([None, _thinker(max_tokens=3)])
    echo = audio([None, _thinker(max_tokens=3), {"voice": "echo"}])
    assert echo[:4] == b"RIFF" and echo != alloy
    # An entry for a stage this request does not run is checked, then has no
    # effect: the talker's voice on a text-only request.
    text_only = _chat(client, [None, _thinker(max_tokens=3), {"voice": "echo"}])
    assert text_only.choices[0].message.audio is None


def test_streaming_honours_the_entry(client: openai.OpenAI) -> None:
    stream = _chat(
        client,
        [None, _thinker(max_tokens=2)],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You said:"
    assert chunks[-1].usage.completion_tokens == 2


def test_completions_honour_the_entry(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=50,
        extra_body={"sampling_params_list": [None, {"max_tokens": 2}]},
    )
    assert reply.usage.completion_tokens == 2
    assert reply.choices[0].text == "You said:"


# entries → the exact ``param`` of the 400.
REFUSED: dict[str, tuple[Any, str]] = {
    # The request: entry 0 is the guardrail, which does not sample.
    "guardrail entry": ([{"max_tokens": 2}, {"max_tokens": 2}], ".0.max_tokens"),
    "example thinker keys": (
        [None, _thinker(top_p=1.0, top_k=-1, repetition_penalty=1.1)],
        ".1.top_p",
    ),
    "outside the stage's domain": ([None, {"max_tokens": 0}], ".1.max_tokens"),
    "wrong type": ([None, {"temperature": "hot"}], ".1.temperature"),
    "talker speed": ([None, None, {"speed": 9.0}], ".2.speed"),
    "vocoder takes nothing": ([None, None, None, {"seed": 1}], ".3.seed"),
    "image size": ([None] * 4 + [{"size": "7x7"}], ".4.size"),
    "entry not a mapping": ([None, "greedy"], ".1"),
    "longer than the pipeline": ([None] * 7, ""),
    "not a list": ({"max_tokens": 2}, ""),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_cannot_be_honoured_is_refused(client: openai.OpenAI, case: str) -> None:
    entries, where = REFUSED[case]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, entries)
    assert info.value.body["param"] == f"sampling_params_list{where}"  # type: ignore[index]


def test_openapi_describes_it(omni_server: OmniServer) -> None:
    document = httpx.get(
        omni_server.base_url + "/openapi.json", headers=omni_server.headers()
    ).json()
    schemas = document["components"]["schemas"]
    for model in (
        "ChatCompletionRequest",
        "CompletionRequest",
        "SpeechRequest",
        "ImageGenerationRequest",
    ):
        field = schemas[model]["properties"]["sampling_params_list"]
        assert "stage with id i" in field["description"], field
        # Entry i is stage i's parameters, with their domains.
        stages = field["anyOf"][0]["prefixItems"]
        assert [s["description"] for s in stages][:2] == [
            "stage 0 (guardrail, guardrail)",
            "stage 1 (thinker, text)",
        ]
        thinker = stages[1]["anyOf"][0]
        assert thinker["additionalProperties"] is False
        assert thinker["properties"]["max_tokens"]["maximum"] == 4096
        assert field["anyOf"][0]["items"] is False


# -- the other routes that run stages ----------------------------------------------


def _http(omni_server: OmniServer) -> httpx.Client:
    return httpx.Client(
        base_url=omni_server.base_url, headers=omni_server.headers(), timeout=60
    )


def test_speech_honours_the_talker_entry(client: openai.OpenAI) -> None:
    def speak(entries: Any) -> bytes:
        return client.audio.speech.create(
            model=MODEL,
            input="hello there",
            voice="alloy",
            extra_body={"sampling_params_list": entries},
        ).content

    alloy = speak(None)
    assert speak([None, None, {"voice": "echo"}]) != alloy
    assert len(speak([None, None, {"speed": 2.0}])) < len(alloy)
    with pytest.raises(openai.BadRequestError) as info:
        speak([None, None, {"speed": 9.0}])
    assert info.value.body["param"] == "sampling_params_list.2.speed"  # type: ignore[index]


def test_images_honour_the_image_entry(client: openai.OpenAI) -> None:
    def images(entries: Any) -> list[str]:
        reply = client.images.generate(
            model=MODEL, prompt="a cat", extra_body={"sampling_params_list": entries}
        )
        return [image.b64_json or "" for image in reply.data or []]

    default = images(None)
    assert len(images([None] * 4 + [{"n": 2}])) == 2
    assert images([None] * 4 + [{"seed": 7}]) != default
    with pytest.raises(openai.BadRequestError) as info:
        images([None] * 4 + [{"size": "7x7"}])
    assert info.value.body["param"] == "sampling_params_list.4.size"  # type: ignore[index]


def test_a_form_honours_the_list_as_json_text(omni_server: OmniServer) -> None:
    """Image edits and video forms: a form field is text, so the list is its
    JSON text; text that is not JSON is a 400 naming the field."""
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buffer, "PNG")
    files = {"image": ("in.png", buffer.getvalue(), "image/png")}
    entries = json.dumps([None] * 4 + [{"n": 2}] + [{"fps": 3, "seconds": 1}])
    with _http(omni_server) as http:
        edit = http.post(
            "/v1/images/edits",
            files=files,
            data={"prompt": "bluer", "sampling_params_list": entries},
        )
        assert edit.status_code == 200, edit.text
        assert len(edit.json()["data"]) == 2
        job = http.post(
            "/v1/videos", data={"prompt": "waves", "sampling_params_list": entries}
        )
        assert job.status_code == 200, job.text
        assert _video_frames(http, job.json()["id"]) == 3
        refused = [
            http.post(
                "/v1/images/edits",
                files=files,
                data={"prompt": "bluer", "sampling_params_list": "[null,"},
            ),
            http.post(
                "/v1/videos", data={"prompt": "waves", "sampling_params_list": "n=2"}
            ),
            http.post(
                "/v1/images/edits",
                files=files,
                data={"prompt": "bluer", "sampling_params_list": '[{"n": 2}]'},
            ),
        ]
    for response, param in zip(
        refused,
        ["sampling_params_list", "sampling_params_list", "sampling_params_list.0.n"],
        strict=True,
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def _video_frames(http: httpx.Client, video_id: str) -> int:
    """The frame count of a video job's GIF, once the job completed."""
    deadline = time.monotonic() + 30
    while http.get(f"/v1/videos/{video_id}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    content = http.get(f"/v1/videos/{video_id}/content")
    assert content.status_code == 200
    with Image.open(io.BytesIO(content.content)) as gif:
        return int(gif.n_frames)


def test_video_create_checks_the_list_before_the_job(omni_server: OmniServer) -> None:
    with _http(omni_server) as http:
        bad = http.post(
            "/v1/videos",
            json={
                "prompt": "waves",
                "sampling_params_list": [None] * 5 + [{"fps": 99}],
            },
        )
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["param"] == "sampling_params_list.5.fps"


def test_realtime_response_create_honours_the_entry(omni_server: OmniServer) -> None:
    url = omni_server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"

    def respond(ws: ClientConnection, entries: Any) -> list[dict[str, Any]]:
        response = {"instructions": PROMPT, "sampling_params_list": entries}
        ws.send(json.dumps({"type": "response.create", "response": response}))
        events = []
        while not events or events[-1]["type"] not in ("response.done", "error"):
            events.append(json.loads(ws.recv(timeout=10)))
        return events

    with connect(url, additional_headers=omni_server.headers()) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        events = respond(ws, [None, {"max_tokens": 2}])
        text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
        assert text == "You said:"
        (error,) = [
            e for e in respond(ws, [None, {"top_k": 2}]) if e["type"] == "error"
        ]
    assert error["error"]["param"] == "response.sampling_params_list.1.top_k"


def test_a_video_job_runs_with_the_entry(omni_server: OmniServer) -> None:
    entries = [None] * 5 + [{"fps": 3, "seconds": 1}]
    with _http(omni_server) as http:
        job = http.post(
            "/v1/videos", json={"prompt": "waves", "sampling_params_list": entries}
        )
        assert job.status_code == 200, job.text
        assert _video_frames(http, job.json()["id"]) == 3
