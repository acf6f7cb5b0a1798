"""What the partition drills share: clients that record every outcome, and
the checks run on what they saw.

Both drill modules (``tests/e2e/test_partitions.py``, a ``remote: true``
stage over ``tcp://``; ``tests/ray/test_ray_partitions.py``, a Ray worker
node) serve the same pipeline shape: a thinker (text) near the server, a
talker on the far host, a vocoder near the server. So a text request never
needs the far host, an audio request starts there, and a text+audio request
moves on to it from the thinker. Each request goes through the official
OpenAI SDK (SSE through httpx, to see the raw events) and leaves one
``Outcome``: what the client got, when, and everything it could read (for
the leak scan). ``Traffic`` keeps such requests going from a few threads
while a link is cut, healed or flapping.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from collections.abc import Iterable
from typing import Any

import httpx
import openai

from tests.e2e.servers import metric_samples, sample_delta

CHAT = "/v1/chat/completions"
MODEL = "omni-partition"
FAR_STAGE = 1
GENERIC = "The server had an error while processing your request."
# The route of each kind of request: does it need the far host's talker?
MODALITIES: dict[str, list[str]] = {
    "text": ["text"],
    "audio": ["audio"],
    "both": ["text", "audio"],
}
STOPPED = f"Stage {FAR_STAGE} (talker) stopped answering."
NOT_ANSWERING = f"Stage {FAR_STAGE} (talker) is not answering; retry later."

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def pipeline(**top: Any) -> dict[str, Any]:
    """The drill pipeline; ``top`` adds top-level keys, ``near``/``far`` the
    placement of each stage (``remote: true``, or Ray options)."""
    near, far = top.pop("near"), top.pop("far")
    return {
        "model": MODEL,
        "stages": [
            {"id": 0, "name": "thinker", "kind": "text", "timeout_s": 60, **near},
            {"id": 1, "name": "talker", "kind": "talker", "timeout_s": 60, **far},
            {"id": 2, "name": "vocoder", "kind": "vocoder", "timeout_s": 60, **near},
        ],
        "faults": [
            {"stage": 0, "marker": "@hang", "action": "hang"},
            {"stage": 1, "marker": "@talkhang", "action": "hang"},
        ],
        **top,
    }


@dataclasses.dataclass
class Outcome:
    """One request as its client saw it."""

    kind: str
    sent: float
    done: float = 0.0
    # 0: no response at all (the connection failed or timed out).
    status: int = 0
    # The error object of the body, or of a stream's error event.
    error: dict[str, Any] | None = None
    retry_after: str | None = None
    # Every data line of a stream, in order.
    events: list[str] = dataclasses.field(default_factory=list)
    # Body, headers and events: what the leak scan reads.
    seen: str = ""

    @property
    def code(self) -> int:
        """The status the client was given: the error's for a stream."""
        return int(self.error["code"]) if self.error else self.status

    @property
    def stage_id(self) -> int | None:
        return self.error.get("stage_id") if self.error else None


def chat(client: openai.OpenAI, prompt: str, kind: str) -> Outcome:
    """One chat completion through the SDK (no retries)."""
    outcome = Outcome(kind, time.monotonic())
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            modalities=MODALITIES[kind],  # type: ignore[arg-type]
        )
        outcome.status = raw.status_code
        outcome.seen = raw.text + json.dumps(dict(raw.headers))
        message = raw.parse().choices[0].message
        if "text" in MODALITIES[kind]:
            assert message.content == f"You said: {prompt}", message
        if "audio" in MODALITIES[kind]:
            assert message.audio is not None and message.audio.data, message
    except openai.APIStatusError as exc:
        outcome.status = exc.status_code
        outcome.error = exc.response.json()["error"]
        outcome.retry_after = exc.response.headers.get("retry-after")
        outcome.seen = exc.response.text + json.dumps(dict(exc.response.headers))
    except openai.APIConnectionError as exc:
        outcome.seen = repr(exc)
    outcome.done = time.monotonic()
    return outcome


def stream(base_url: str, prompt: str, kind: str, sink: list[Outcome]) -> Outcome:
    """One streamed chat completion (SSE over httpx); appended to ``sink``
    once its first event arrived, so a drill can wait for it mid-way."""
    outcome = Outcome(f"sse-{kind}", time.monotonic())
    with httpx.stream(
        "POST",
        base_url + CHAT,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "modalities": MODALITIES[kind],
            "stream": True,
        },
        timeout=60,
    ) as response:
        outcome.status = response.status_code
        outcome.seen = json.dumps(dict(response.headers))
        for line in response.iter_lines():
            outcome.seen += line + "\n"
            if not line.startswith("data: "):
                continue
            outcome.events.append(line[len("data: ") :])
            if len(outcome.events) == 1:
                sink.append(outcome)
    errors = [json.loads(e)["error"] for e in outcome.events if '"error"' in e]
    outcome.error = errors[0] if errors else None
    outcome.done = time.monotonic()
    if not outcome.events:
        sink.append(outcome)
    return outcome


class Traffic:
    """Requests of the given kinds, one thread each, back to back (a short
    pause between) until the block ends; every outcome is kept."""

    def __init__(self, client: openai.OpenAI, kinds: Iterable[str]) -> None:
        self._client = client
        self._stop = threading.Event()
        self.outcomes: list[Outcome] = []
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), name=f"traffic-{kind}")
            for kind in kinds
        ]

    def _run(self, kind: str) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.outcomes.append(chat(self._client, f"{kind} {n}", kind))
            self._stop.wait(0.05)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def until_served(client: openai.OpenAI, kind: str, *, within_s: float) -> Outcome:
    """Retry as a client should (after each 503's ``Retry-After``) until the
    request is served; the served outcome."""
    deadline = time.monotonic() + within_s
    while True:
        outcome = chat(client, f"back {kind}", kind)
        if outcome.status == 200:
            return outcome
        assert outcome.status == 503 and time.monotonic() < deadline, outcome
        time.sleep(float(outcome.retry_after or 1))


def check_silent_stage_outcome(outcome: Outcome) -> None:
    """A request the far stage held or was needed for, while it was silent:
    504 (it was there) or 503 with ``Retry-After`` (it needed it), both with
    the far stage's id, the orchestrator's own text, nothing else."""
    assert outcome.error is not None, outcome
    error = outcome.error
    assert (error["stage_id"], error["param"]) == (FAR_STAGE, None), outcome
    if outcome.code == 504:
        assert (error["type"], error["message"]) == ("GatewayTimeoutError", STOPPED)
    else:
        assert (outcome.code, error["type"], error["message"]) == (
            503,
            "ServiceUnavailableError",
            NOT_ANSWERING,
        ), outcome
        if outcome.status == 503:  # a plain response; a stream has no header
            assert outcome.retry_after == "1", outcome


def check_each_request_ended_once(outcomes: list[Outcome]) -> None:
    """Every request got a response: served, or refused / timed out by the
    silent far stage. A text request never needs the far host: always
    served."""
    for outcome in outcomes:
        assert outcome.status in (200, 503, 504), outcome
        if outcome.kind == "text":
            assert outcome.status == 200, outcome
        if outcome.code != 200:
            check_silent_stage_outcome(outcome)
        if outcome.events:
            # A stream ends once: its last event is [DONE], preceded by at
            # most one error event, which is then its last word.
            assert outcome.events[-1] == "[DONE]", outcome
            errors = [i for i, e in enumerate(outcome.events) if '"error"' in e]
            assert errors in ([], [len(outcome.events) - 2]), outcome


def metrics_settled(base_url: str, before: Samples, requests: int) -> Samples:
    """The server's metrics once its HTTP count grew by ``requests`` (the
    instrumentator counts a response just after sending it)."""
    deadline = time.monotonic() + 10
    while True:
        after = metric_samples(base_url)
        if (
            sample_delta(before, after, "http_requests_total", handler=CHAT) >= requests
            or time.monotonic() > deadline
        ):
            return after


def check_metrics(before: Samples, after: Samples, outcomes: list[Outcome]) -> None:
    """``http_requests_total`` and ``vllm_omni:errors_total`` grew by exactly
    what the clients saw: per status group, and per transport, type and code
    for each error (a stream's error event counts as ``sse``)."""
    statuses = collections.Counter(f"{o.status // 100}xx" for o in outcomes)
    counted = {
        group: sample_delta(
            before, after, "http_requests_total", handler=CHAT, status=group
        )
        for group in ("2xx", "4xx", "5xx")
    }
    assert counted == {g: float(statuses.get(g, 0)) for g in counted}
    errors = collections.Counter(
        ("sse" if o.events else "http", o.error["type"], str(o.code))
        for o in outcomes
        if o.error is not None
    )
    rendered = {
        (dict(labels)["transport"], dict(labels)["type"], dict(labels)["code"]): value
        - before.get((name, labels), 0.0)
        for (name, labels), value in after.items()
        if name == "vllm_omni:errors_total" and value != before.get((name, labels), 0.0)
    }
    assert rendered == {key: float(count) for key, count in errors.items()}
