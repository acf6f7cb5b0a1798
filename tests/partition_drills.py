"""What the partition drills share: clients that record every outcome, and
the checks run on what they saw.

Both drill modules (``tests/e2e/test_partitions.py``, a ``remote: true``
stage over ``tcp://``; ``tests/ray/test_ray_partitions.py``, a Ray worker
node) serve the same pipeline shape: a thinker (text) near the server, a
talker on the far host, a vocoder near the server. So a text chat never
needs the far host, a speech request (``/v1/audio/speech``) starts there,
and a chat with text and audio moves on to it from the thinker. Each
request goes through the official OpenAI SDK (SSE through httpx, to see the
raw events) and leaves one ``Outcome``: what the client got, when, and
everything it could read (for the leak scan). ``Traffic`` keeps such
requests going from a few threads while a link is cut, healed or flapping.

The drills themselves are written once, here, against a ``Deployment`` (the
servers, the link to cut, the far host and what the backend must not leak);
each module's tests call them, so both backends are held to the same
checks.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import openai
import psutil

from tests import netns
from tests.e2e.omni_server import OmniServer
from tests.e2e.servers import metric_samples, sample_delta

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
MODEL = "omni-partition"
FAR_STAGE = 1
GENERIC = "The server had an error while processing your request."
# The chat modalities of each kind of chat: "text" never needs the far
# host's talker, "both" moves on to it from the thinker. The third kind,
# "audio", is a speech request: it starts at the talker.
MODALITIES: dict[str, list[str]] = {"text": ["text"], "both": ["text", "audio"]}
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
    # The route, as ``http_requests_total`` labels it.
    handler: str = CHAT
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


def ask(client: openai.OpenAI, prompt: str, kind: str) -> Outcome:
    """One request of ``kind`` through the SDK (no retries): a chat, or for
    ``audio`` a speech request."""
    outcome = Outcome(kind, time.monotonic(), SPEECH if kind == "audio" else CHAT)
    try:
        if kind == "audio":
            speech = client.audio.speech.with_raw_response.create(
                model=MODEL, voice="alloy", input=prompt
            )
            outcome.status = speech.status_code
            # The body is WAV: only the headers are text a client reads.
            outcome.seen = json.dumps(dict(speech.headers))
            assert speech.content[:4] == b"RIFF", speech.content[:16]
        else:
            _chat(client, prompt, kind, outcome)
    except openai.APIStatusError as exc:
        outcome.status = exc.status_code
        outcome.error = exc.response.json()["error"]
        outcome.retry_after = exc.response.headers.get("retry-after")
        outcome.seen = exc.response.text + json.dumps(dict(exc.response.headers))
    except openai.APIConnectionError as exc:
        outcome.seen = repr(exc)
    outcome.done = time.monotonic()
    return outcome


def _chat(client: openai.OpenAI, prompt: str, kind: str, outcome: Outcome) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        modalities=MODALITIES[kind],  # type: ignore[arg-type]
    )
    outcome.status = raw.status_code
    body = json.loads(raw.text)
    for choice in body["choices"]:
        if choice["message"].get("audio"):
            # Base64 WAV: any short marker occurs in it by chance.
            choice["message"]["audio"]["data"] = "<audio>"
    outcome.seen = json.dumps(body) + json.dumps(dict(raw.headers))
    message = raw.parse().choices[0].message
    assert message.content == f"You said: {prompt}", message
    if "audio" in MODALITIES[kind]:
        assert message.audio is not None and message.audio.data, message


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
        # A check that failed inside a thread (say, a wrong reply text).
        self.failures: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), name=f"traffic-{kind}")
            for kind in kinds
        ]

    def _run(self, kind: str) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                self.outcomes.append(ask(self._client, f"{kind} {n}", kind))
                self._stop.wait(0.05)
        except BaseException as exc:  # raised again in the test's thread
            self.failures.append(exc)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)
        assert not any(t.is_alive() for t in self._threads), "a request never ended"
        if self.failures:
            raise self.failures[0]


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
        counted = sum(
            sample_delta(before, after, "http_requests_total", handler=handler)
            for handler in (CHAT, SPEECH)
        )
        if counted >= requests or time.monotonic() > deadline:
            return after


def check_metrics(before: Samples, after: Samples, outcomes: list[Outcome]) -> None:
    """``http_requests_total`` and ``vllm_omni:errors_total`` grew by exactly
    what the clients saw: per route and status group, and per transport,
    type and code for each error (a stream's error event counts as ``sse``)."""
    statuses = collections.Counter(
        (o.handler, f"{o.status // 100}xx") for o in outcomes
    )
    counted = {
        (handler, group): sample_delta(
            before, after, "http_requests_total", handler=handler, status=group
        )
        for handler in (CHAT, SPEECH)
        for group in ("2xx", "4xx", "5xx")
    }
    assert counted == {key: float(statuses.get(key, 0)) for key in counted}
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


# -- the drills ----------------------------------------------------------------

# The drills' timeouts, short so that a module takes about a minute: silent
# after 1.5 s (three heartbeats missed and a half), dead after 6 s; a far
# stage gives up on a silent orchestrator after twice that.
HEARTBEAT_TIMEOUT_S = 6.0
SILENCE_TIMEOUT_S = 1.5
ORCHESTRATOR_TIMEOUT_S = 2 * HEARTBEAT_TIMEOUT_S
SHORT_CUT_S = 2.5
FLAP_DOWN_S, FLAP_UP_S, FLAP_FOR_S = 0.3, 0.3, 5.0
KEEP_ALIVE = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}


@dataclasses.dataclass
class Deployment:
    """Two servers ("main", "alive": keep-alive) whose talkers run on the
    far host, across ``link``."""

    network: netns.Network
    far: netns.Host
    link: netns.Link
    servers: dict[str, OmniServer]
    # The far host's processes that run a server's talker, by server name.
    far_stage_pids: Callable[[str], list[int]]
    # Everything of the hosts and the backend a client must not see.
    leaks: Callable[[str], list[str]]

    def client(self, name: str = "main") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.servers[name].base_url + "/v1",
            api_key="x",
            max_retries=0,
            timeout=60,
        )


def check_no_leaks(deployment: Deployment, outcomes: Iterable[Outcome]) -> None:
    leaks = [(o.kind, deployment.leaks(o.seen)) for o in outcomes]
    assert [leak for leak in leaks if leak[1]] == []


def _check_served_throughout(deployment: Deployment, far_pids: list[int]) -> None:
    """No engine death, the same far stage processes (never restarted)."""
    server = deployment.servers["main"]
    assert server.proc.poll() is None
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert "engine dead" not in server.log()
    assert deployment.far_stage_pids("main") == far_pids


def _hold(client: openai.OpenAI, prompt: str, kind: str, sink: list[Outcome]) -> Any:
    """A request in a thread (a hang fault holds it in its stage)."""
    thread = threading.Thread(target=lambda: sink.append(ask(client, prompt, kind)))
    thread.start()
    return thread


def _served_since(traffic: Traffic, since: float, *, within_s: float) -> float:
    """Wait until an audio request sent after ``since`` was served; when."""
    deadline = time.monotonic() + within_s
    while True:
        served = [
            o.done
            for o in traffic.outcomes
            if o.kind == "audio" and o.status == 200 and o.sent > since
        ]
        if served:
            return min(served)
        assert time.monotonic() < deadline, "not served again"
        time.sleep(0.05)


def _until_served(client: openai.OpenAI) -> list[Outcome]:
    """Audio requests, each after the last one's Retry-After, until one is
    served; every outcome."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + 15
    while not outcomes or outcomes[-1].status != 200:
        assert time.monotonic() < deadline, outcomes
        if outcomes:
            time.sleep(float(outcomes[-1].retry_after or 1))
        outcomes.append(ask(client, "back again", "audio"))
    return outcomes


def short_partition(deployment: Deployment) -> dict[str, float]:
    """Cut for ``SHORT_CUT_S`` (below the heartbeat timeout), then heal, with
    a request held at the far stage and every kind of request going on:
    504 for the held one, 503 for what needs the far stage, text served
    throughout; served again after the heal by the same stage processes.
    Returns the timings (seconds)."""
    network, link = deployment.network, deployment.link
    server = deployment.servers["main"]
    client = deployment.client()
    far_pids = deployment.far_stage_pids("main")
    before = metric_samples(server.base_url)
    held: list[Outcome] = []
    holder = _hold(client, "hold @talkhang", "audio", held)
    time.sleep(1.0)  # at the talker, which holds it
    with Traffic(client, ["text", "audio", "both"]) as traffic:
        time.sleep(0.5)
        network.cut(link)
        cut = time.monotonic()
        holder.join(timeout=10)
        time.sleep(max(0.0, cut + SHORT_CUT_S - time.monotonic()))
        network.restore(link)
        healed = time.monotonic()
        first_served = _served_since(traffic, healed, within_s=15)
        time.sleep(0.5)
    outcomes = held + traffic.outcomes
    [timed_out] = held
    check_silent_stage_outcome(timed_out)
    assert timed_out.code == 504
    check_each_request_ended_once(outcomes)
    during = [o for o in outcomes if cut + SILENCE_TIMEOUT_S + 0.5 < o.sent < healed]
    assert {o.code for o in during if o.kind == "audio"} == {503}
    assert {o.code for o in during if o.kind == "text"} == {200}
    timings = {
        "cut_to_first_503_504_s": min(o.done for o in outcomes if o.code != 200) - cut,
        "cut_to_held_504_s": timed_out.done - cut,
        "heal_to_first_served_s": first_served - healed,
    }
    assert timings["cut_to_first_503_504_s"] < SILENCE_TIMEOUT_S + 1.5
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_served_throughout(deployment, far_pids)
    check_no_leaks(deployment, outcomes)
    return timings


def flapping_link(deployment: Deployment) -> dict[str, float]:
    """The link down ``FLAP_DOWN_S``, up ``FLAP_UP_S``, for ``FLAP_FOR_S``,
    under traffic: every request ends once (served, or 503/504 from the far
    stage), the engine never dies, the metrics are what the clients saw."""
    server = deployment.servers["main"]
    client = deployment.client()
    far_pids = deployment.far_stage_pids("main")
    before = metric_samples(server.base_url)
    with Traffic(client, ["text", "audio", "both"]) as traffic:
        with deployment.network.flap(
            deployment.link, down_s=FLAP_DOWN_S, up_s=FLAP_UP_S
        ) as flap:
            time.sleep(FLAP_FOR_S)
        _served_since(traffic, time.monotonic(), within_s=15)
    outcomes = traffic.outcomes
    check_each_request_ended_once(outcomes)
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_served_throughout(deployment, far_pids)
    check_no_leaks(deployment, outcomes)
    return {
        "cuts": flap.cuts,
        "requests": len(outcomes),
        "refused_or_timed_out": sum(1 for o in outcomes if o.code != 200),
    }


def cut_mid_stream(deployment: Deployment) -> None:
    """A stream whose text is out and whose talker (far) holds the rest: the
    cut ends it with one error event (504, the far stage) and ``[DONE]``."""
    network, link = deployment.network, deployment.link
    server = deployment.servers["main"]
    far_pids = deployment.far_stage_pids("main")
    before = metric_samples(server.base_url)
    started: list[Outcome] = []
    streamer = threading.Thread(
        target=stream, args=(server.base_url, "speak @talkhang", "both", started)
    )
    streamer.start()
    deadline = time.monotonic() + 10
    while not started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.5)  # the text is out; the talker holds the rest
    network.cut(link)
    streamer.join(timeout=15)
    network.restore(link)
    [streamed] = started
    assert streamed.status == 200
    assert json.loads(streamed.events[0])["choices"][0]["delta"]  # mid-way
    assert streamed.events[-1] == "[DONE]"
    assert [e for e in streamed.events if '"error"' in e] == [streamed.events[-2]]
    check_silent_stage_outcome(streamed)
    assert streamed.code == 504
    outcomes = [streamed, *_until_served(deployment.client())]
    check_each_request_ended_once(outcomes)
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_served_throughout(deployment, far_pids)
    check_no_leaks(deployment, outcomes)


def long_partition(deployment: Deployment) -> tuple[float, dict[str, float]]:
    """Cut for good: the held talker request 504s once the stage is silent;
    past the heartbeat timeout the engine is dead (500 naming the far stage
    for what is in flight), the main server exits 1, the keep-alive one
    answers ``/health`` 503 and the dead 500. The far side is the caller's
    to check. Returns when the cut was made, and the timings."""
    main, alive = deployment.servers["main"], deployment.servers["alive"]
    held: dict[str, list[Outcome]] = {"main": [], "alive": [], "talker": []}
    holders = [
        _hold(deployment.client(), "think @hang", "text", held["main"]),
        _hold(deployment.client("alive"), "think @hang", "text", held["alive"]),
        _hold(deployment.client(), "talk @talkhang", "audio", held["talker"]),
    ]
    time.sleep(1.0)
    # What the main server started here: gone with it once it exits.
    tree = psutil.Process(main.proc.pid).children(recursive=True)
    deployment.network.cut(deployment.link)
    cut = time.monotonic()
    for holder in holders:
        holder.join(timeout=30)
    [at_talker] = held["talker"]
    check_silent_stage_outcome(at_talker)
    assert at_talker.code == 504
    for [dead] in (held["main"], held["alive"]):
        assert dead.error is not None, dead
        assert (dead.status, dead.error["type"], dead.stage_id) == (
            500,
            "InternalServerError",
            FAR_STAGE,
        )
        assert dead.error["message"] == GENERIC
    died = held["main"][0].done - cut
    assert HEARTBEAT_TIMEOUT_S - 1.0 < died < HEARTBEAT_TIMEOUT_S + 2.0, died
    assert main.proc.wait(timeout=20) == 1
    _, survivors = psutil.wait_procs(tree, timeout=10)
    assert survivors == [], survivors
    assert "engine dead: stage 1 (talker) failed fatally: " in main.log()
    health = httpx.get(alive.base_url + "/health")
    assert health.status_code == 503
    after_death = ask(deployment.client("alive"), "anyone?", "text")
    assert (after_death.status, after_death.stage_id) == (500, FAR_STAGE)
    assert alive.proc.poll() is None
    outcomes = [
        at_talker,
        *held["main"],
        *held["alive"],
        after_death,
        Outcome("health", cut, status=503, seen=health.text),
    ]
    check_no_leaks(deployment, outcomes)
    return cut, {"cut_to_engine_death_s": died}
