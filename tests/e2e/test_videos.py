"""Async video jobs end to end: a real ``vllm-omni serve``, the OpenAI SDK.

One server per module, on the reference stages with two video fault markers
(``@boom`` raises in the video stage, ``@hang`` sleeps past any test), behind
an API key, with its own job store; the last test restarts it on the same
store. What is pinned (docs/design.md §4, async jobs): a job's GIF; a failed job's
stored canonical error with its ``retryable``, returned unchanged by
``retrieve`` and answered with its own status and body by
``download_content`` (server and client errors alike), whose retry guidance
is ``x-should-retry: false`` (a repeat reads the same record); 409 for
content of an unfinished or cancelled job; 501 remix; 404 for unknown ids;
cancellation and deletion; and a restart that keeps stored errors byte for
byte and fails interrupted jobs with 503.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.e2e.conftest import API_KEY
from tests.e2e.omni_server import FAULTS, OmniServer, start_server, write_pipeline
from tests.e2e.servers import metric_samples, sample_delta, serve_in_thread

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")

GENERIC = "The server had an error while processing your request."
RESTARTED = "The server restarted before the job finished; submit it again."
VIDEO_FAULTS: list[dict[str, Any]] = [
    {"stage": "video", "marker": "@boom", "action": "raise"},
    {"stage": "video", "marker": "@hang", "action": "hang"},
    {
        "stage": "video",
        "marker": "@refuse",
        "action": "raise",
        "exception": "vllm.exceptions:VLLMValidationError",
        "args": ["seconds cannot be rendered by this stage"],
        "kwargs": {"parameter": "seconds"},
    },
]
ERRORS = "vllm_omni:errors_total"


def _http_body(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored job error as an HTTP error body: an HTTP response carries its
    retry guidance in ``x-should-retry``, not as ``retryable``."""
    return {k: v for k, v in stored.items() if k != "retryable"}


def _assert_final(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> None:
    """A failed job's content is final: the SDK must not retry it."""
    headers = caught.value.response.headers
    assert headers.get_list("x-should-retry") == ["false"]
    assert headers.get_list("retry-after") == []


@dataclass
class VideoServer:
    """The module's server; ``restart`` replaces it on the same job store."""

    directory: Path
    pipeline: Path
    job_store: Path
    server: OmniServer

    @property
    def url(self) -> str:
        return self.server.base_url

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY, max_retries=0)

    def restart(self) -> None:
        self.server.stop()
        # SIGTERM is a graceful shutdown: stages stopped in order, exit 0.
        assert self.server.proc.returncode == 0, self.server.log()[-2000:]
        self.server = start_server(
            self.directory, self.pipeline, api_key=API_KEY, job_store=self.job_store
        )
        self.server.wait_ready()


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VideoServer]:
    directory = tmp_path_factory.mktemp("videos")
    pipeline = write_pipeline(directory, faults=VIDEO_FAULTS + FAULTS)
    # A parent that does not exist yet: the server creates it.
    job_store = directory / "store" / "jobs.sqlite3"
    server = start_server(directory, pipeline, api_key=API_KEY, job_store=job_store)
    holder = VideoServer(directory, pipeline, job_store, server)
    try:
        server.wait_ready()
        yield holder
    finally:
        holder.server.stop()


# autouse: started beside the module's server, not when its one test comes.
@pytest.fixture(scope="module", autouse=True)
def retention_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OmniServer]:
    """A server of its own with ``--job-retention 3`` for the retention test
    (which waits for it): started with the module, not yet ready."""
    directory = tmp_path_factory.mktemp("retention")
    server = start_server(
        directory,
        write_pipeline(directory),
        api_key=API_KEY,
        extra_args=("--job-retention", "3"),
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def client(videos: VideoServer) -> Iterator[openai.OpenAI]:
    with videos.client() as sdk:
        yield sdk


def _wait(client: openai.OpenAI, video_id: str, *statuses: str) -> Any:
    deadline = time.monotonic() + 15
    while True:
        video = client.videos.retrieve(video_id)
        if video.status in statuses or time.monotonic() > deadline:
            assert video.status in statuses, video
            return video
        time.sleep(0.05)


def _raw_error(videos: VideoServer, video_id: str) -> str:
    """The ``error`` member of the retrieve body, as the JSON text it was sent as."""
    response = httpx.get(
        f"{videos.url}/v1/videos/{video_id}", headers=videos.server.headers()
    )
    assert response.status_code == 200
    return json.dumps(response.json()["error"])


def _gif_frames(data: bytes) -> int:
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "GIF"
        return int(image.n_frames)


# -- success -------------------------------------------------------------------------


def test_job_completes_and_content_is_a_gif(client: openai.OpenAI) -> None:
    created = client.videos.create(prompt="a red ball", seconds="1", size="64x64")
    assert created.object == "video"
    assert created.status == "queued"
    assert created.id.startswith("video_")
    assert created.model == "omni-reference"
    assert (created.seconds, created.size, created.error) == ("1", "64x64", None)

    done = _wait(client, created.id, "completed")
    assert done.progress == 100
    assert done.completed_at is not None and done.completed_at >= done.created_at
    content = client.videos.download_content(created.id)
    assert content.response.headers["content-type"] == "image/gif"
    assert _gif_frames(content.read()) > 1


def test_json_body_is_accepted(videos: VideoServer, client: openai.OpenAI) -> None:
    response = httpx.post(
        videos.url + "/v1/videos",
        json={"prompt": "json body", "seconds": 0.5, "size": "64x64"},
        headers=videos.server.headers(),
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "queued"
    assert response.json()["seconds"] == "0.5"
    _wait(client, response.json()["id"], "completed")


def test_list_is_newest_first_and_pages(client: openai.OpenAI) -> None:
    ids = [client.videos.create(prompt=f"list {i}", seconds="0.2").id for i in range(3)]
    page = client.videos.list(limit=2)
    assert [v.id for v in page.data] == ids[::-1][:2]
    assert page.has_more is True
    listed = [v.id for v in client.videos.list(limit=2)]  # the SDK follows cursors
    assert listed[:3] == ids[::-1]
    assert len(listed) == len(set(listed))
    with pytest.raises(openai.BadRequestError) as caught:
        client.videos.list(limit=0)
    assert caught.value.body["param"] == "limit"  # type: ignore[index]


# -- request errors ------------------------------------------------------------------

# (create arguments, SDK exception, status, error.type, param)
CREATE_ERRORS: dict[str, tuple[dict[str, Any], type[Exception], int, str, Any]] = {
    "empty prompt": (
        {"prompt": " "},
        openai.BadRequestError,
        400,
        "BadRequestError",
        "prompt",
    ),
    "seconds not a number": (
        {"prompt": "x", "seconds": "four"},
        openai.BadRequestError,
        400,
        "BadRequestError",
        "seconds",
    ),
    "size not WxH": (
        {"prompt": "x", "size": "large"},
        openai.BadRequestError,
        400,
        "BadRequestError",
        "size",
    ),
    # The video stage's ranges, checked before a job exists (they were a job
    # that failed with this 400).
    "seconds over the stage's range": (
        {"prompt": "x", "seconds": "99"},
        openai.BadRequestError,
        400,
        "BadRequestError",
        "seconds",
    ),
    "size over the stage's range": (
        {"prompt": "x", "size": "1024x1024"},
        openai.BadRequestError,
        400,
        "BadRequestError",
        "size",
    ),
    "unknown model": (
        {"prompt": "x", "model": "sora-2"},
        openai.NotFoundError,
        404,
        "NotFoundError",
        "model",
    ),
    "input_reference": (
        {"prompt": "x", "input_reference": ("ref.png", b"\x89PNG", "image/png")},
        openai.InternalServerError,
        501,
        "NotImplementedError",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CREATE_ERRORS))
def test_create_errors(client: openai.OpenAI, name: str) -> None:
    kwargs, exc_type, status, error_type, param = CREATE_ERRORS[name]
    with pytest.raises(exc_type) as caught:
        client.videos.create(**kwargs)
    error = caught.value.body  # type: ignore[attr-defined]
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert (error["code"], error["type"], error["param"]) == (status, error_type, param)
    assert caught.value.response.headers["x-request-id"] == error["request_id"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"prompt": 5}', "prompt"),
        ('{"prompt": "x", "size": 64}', "size"),
        ('{"prompt": "x", "seconds": 1' + "0" * 400 + "}", "seconds"),
        ('{"prompt": "x", "seconds": 1' + "0" * 5000 + "}", None),
        ("[" * 100_000, None),
        ("[1]", None),
    ],
    ids=["prompt", "size", "huge seconds", "digit limit", "deep", "not an object"],
)
def test_create_json_errors(videos: VideoServer, body: str, param: str | None) -> None:
    response = httpx.post(
        videos.url + "/v1/videos",
        content=body,
        headers={**videos.server.headers(), "content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        400,
        "BadRequestError",
        param,
    )


def test_unknown_id_is_404(client: openai.OpenAI) -> None:
    for call in (
        client.videos.retrieve,
        client.videos.download_content,
        client.videos.delete,
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            call("video_nope")
        assert caught.value.body["type"] == "NotFoundError"  # type: ignore[index]


def test_remix_is_501(client: openai.OpenAI) -> None:
    video = client.videos.create(prompt="remix me", seconds="0.2")
    with pytest.raises(openai.APIStatusError) as caught:
        client.videos.remix(video.id, prompt="again")
    assert caught.value.status_code == 501
    assert caught.value.body["type"] == "NotImplementedError"  # type: ignore[index]
    assert caught.value.body["code"] == 501  # type: ignore[index]


# -- failed jobs ---------------------------------------------------------------------


def test_failed_job_stores_canonical_error(
    videos: VideoServer, client: openai.OpenAI
) -> None:
    before = metric_samples(videos.url)
    video = client.videos.create(prompt="a crash @boom", seconds="0.2")
    failed = _wait(client, video.id, "failed")
    stored = json.loads(_raw_error(videos, video.id))
    assert stored == {
        "message": GENERIC,
        "type": "InternalServerError",
        "param": None,
        "code": 500,
        "request_id": video.id,
        "stage_id": 5,
        "error_stage_id": 5,
        "retryable": True,
    }
    assert failed.error.code == 500
    assert (
        sample_delta(
            before, metric_samples(videos.url), ERRORS, transport="job", code="500"
        )
        == 1
    )

    with pytest.raises(openai.InternalServerError) as caught:
        client.videos.download_content(video.id)
    assert caught.value.status_code == 500
    assert caught.value.body == _http_body(stored)
    _assert_final(caught)
    # The prompt is stored but never part of an error.
    assert "crash" not in json.dumps(stored)


def test_client_error_job_answers_its_own_status(
    videos: VideoServer, client: openai.OpenAI
) -> None:
    """A client error of the video stage fails the job with its 400, which the
    download repeats."""
    video = client.videos.create(prompt="refused @refuse", seconds="1")
    _wait(client, video.id, "failed")
    stored = json.loads(_raw_error(videos, video.id))
    assert (stored["code"], stored["type"], stored["param"]) == (
        400,
        "BadRequestError",
        "seconds",
    )
    assert stored["request_id"] == video.id
    assert stored["retryable"] is False
    with pytest.raises(openai.BadRequestError) as caught:
        client.videos.download_content(video.id)
    assert caught.value.body == _http_body(stored)
    _assert_final(caught)


# -- unfinished, cancelled, deleted ---------------------------------------------------


def test_unfinished_content_is_409_and_delete_cancels(client: openai.OpenAI) -> None:
    video = client.videos.create(prompt="forever @hang", seconds="0.2")
    status = client.videos.retrieve(video.id).status
    assert status in ("queued", "in_progress")
    with pytest.raises(openai.ConflictError) as caught:
        client.videos.download_content(video.id)
    assert caught.value.body["type"] == "ConflictError"  # type: ignore[index]
    assert caught.value.body["code"] == 409  # type: ignore[index]

    cancelled = client.videos.delete(video.id)
    assert (cancelled.id, cancelled.deleted) == (video.id, False)
    assert client.videos.retrieve(video.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.videos.download_content(video.id)

    removed = client.videos.delete(video.id)
    assert (removed.id, removed.deleted, removed.object) == (
        video.id,
        True,
        "video.deleted",
    )
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_delete_finished_job(client: openai.OpenAI) -> None:
    video = client.videos.create(prompt="short lived", seconds="0.2")
    _wait(client, video.id, "completed")
    assert client.videos.delete(video.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    with pytest.raises(openai.NotFoundError):
        client.videos.download_content(video.id)


def test_pipeline_without_video_stage_is_503() -> None:
    """In process, on a stand-in engine that has no video stage."""
    from vllm_omni.entrypoints.openai.api_server import build_app

    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    app.state.engine_client = _ImageOnlyEngine()
    with (
        serve_in_thread(app) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.InternalServerError) as caught:
            sdk.videos.create(prompt="x")
    assert caught.value.status_code == 503
    assert caught.value.body["type"] == "ServiceUnavailableError"  # type: ignore[index]


class _ImageOnlyEngine:
    model_name = "omni-reference"
    modalities = frozenset({"image"})
    errored = False
    is_running = True

    async def check_health(self) -> None:
        return None


# -- retention (a server of its own) ----------------------------------------------


def test_a_finished_job_expires_after_the_retention(
    retention_server: OmniServer,
) -> None:
    """``--job-retention 3``: a finished job says when it expires and from
    then on reads as deleted (retrieve, download, delete, list). Three
    seconds, not one: ``completed_at`` is whole seconds, so a job may expire
    up to a second sooner than the retention after it finished, and one
    second could be gone before the first poll saw it completed."""
    server = retention_server
    server.wait_ready()
    with openai.OpenAI(
        base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0
    ) as sdk:
        created = sdk.videos.create(prompt="short-lived", seconds="0.2")
        assert created.expires_at is None  # not finished yet
        video = _wait(sdk, created.id, "completed")
        assert video.completed_at is not None
        assert video.expires_at == video.completed_at + 3
        assert created.id in [v.id for v in sdk.videos.list()]
        while time.time() < video.expires_at:
            time.sleep(0.1)
        for call in (
            sdk.videos.retrieve,
            sdk.videos.download_content,
            sdk.videos.delete,
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                call(created.id)
            assert caught.value.body["type"] == "NotFoundError"  # type: ignore[index]
        assert created.id not in [v.id for v in sdk.videos.list()]


# -- restart (last: it replaces the module's server) ------------------------------


def test_restart_keeps_errors_and_fails_interrupted_jobs(
    videos: VideoServer,
) -> None:
    with videos.client() as sdk:
        completed = sdk.videos.create(prompt="survivor", seconds="0.2").id
        failed = sdk.videos.create(prompt="boom @boom", seconds="0.2").id
        _wait(sdk, completed, "completed")
        _wait(sdk, failed, "failed")
        # Only the job below may be unfinished when the server stops.
        for video in sdk.videos.list():
            _wait(sdk, video.id, "completed", "failed", "cancelled")
        interrupted = sdk.videos.create(prompt="long @hang", seconds="0.2").id
        _wait(sdk, interrupted, "in_progress")
    failed_error = _raw_error(videos, failed)

    videos.restart()  # SIGTERM while ``interrupted`` is generating

    with videos.client() as sdk:
        assert _raw_error(videos, failed) == failed_error
        assert _gif_frames(sdk.videos.download_content(completed).read()) > 1

        video = sdk.videos.retrieve(interrupted)
        assert video.status == "failed"
        stored = json.loads(_raw_error(videos, interrupted))
        assert stored == {
            "message": RESTARTED,
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
            "request_id": interrupted,
            "retryable": True,
        }
        with pytest.raises(openai.InternalServerError) as caught:
            sdk.videos.download_content(interrupted)
        assert caught.value.status_code == 503
        assert caught.value.body == _http_body(stored)
        _assert_final(caught)
    assert (
        metric_samples(videos.url).get(
            (
                ERRORS,
                (
                    ("category", "server"),
                    ("code", "503"),
                    ("transport", "job"),
                    ("type", "ServiceUnavailableError"),
                ),
            )
        )
        == 1
    )
