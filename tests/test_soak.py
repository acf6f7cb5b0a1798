"""The soak's own arithmetic (benchmarks/soak.py), which CI's soak runs only
take on trust: a long run's log read a block at a time counts what the whole
log counts, and the second-half checks of ``--minutes`` fail on growth."""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter
from pathlib import Path

import psutil
import pytest

from benchmarks import soak

_LINES = [
    "2026-12-04 09:00:00,001 INFO vllm_omni.errors: request r1 rejected with 400",
    "2026-12-04 09:00:00,002 ERROR vllm_omni.errors: request r2 failed with 500",
    # A record Ray's forwarded output pushed mid-line.
    "(StageActor pid=7) chunk2026-12-04 09:00:00,003 WARNING vllm_omni.engine: odd",
    "2026-12-04 09:00:00,004 INFO vllm_omni.errors: request r3 rejected with 404",
]


def test_log_read_in_blocks_counts_what_the_whole_log_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "\n".join(_LINES * 50) + "\n"
    path = tmp_path / "server.log"
    path.write_text("start-up noise\n" + text)
    whole = soak.log_counts(text)
    assert whole[soak.LOG_4XX] == 100 and whole[soak.LOG_OTHER] == 50
    # Blocks that end mid-line, mid-record and mid-timestamp.
    monkeypatch.setattr(soak, "LOG_BLOCK", 37)
    assert soak._logged(path, len("start-up noise\n")) == whole


def _sample(
    at_s: float,
    rss_mib: dict[int, float],
    fds: int,
    threads: int,
    clients: int = 0,
) -> soak.Sample:
    """A sample whose threads are all process 1's; ``clients`` of its fds are
    the client's connections."""
    return soak.Sample(
        at_s=at_s,
        rss={pid: (f"p[{pid}]", int(mib * soak.MiB)) for pid, mib in rss_mib.items()},
        fds=fds,
        fd_kinds={"file": fds - clients, "client connection": clients},
        threads={pid: threads if pid == 1 else 2 for pid in rss_mib},
        job_store=0,
        requests=0,
        p99_s=None,
    )


def _flat_rows(samples: list[soak.Sample]) -> dict[str, bool]:
    report = soak.Report(samples=samples)
    soak._flat(report)
    return {name: ok for name, _, _, ok in report.rows}


def test_second_half_checks_pass_a_plateau() -> None:
    """Growth in the first half (caches filling) is not a leak, nor sockets
    open under load, nor a thread pool filling up."""
    rows = _flat_rows(
        [
            _sample(0, {1: 900, 2: 400}, 136, 30),
            _sample(60, {1: 960, 2: 440}, 160, 34),
            _sample(120, {1: 965, 2: 441}, 168, 34),
            _sample(180, {1: 966, 2: 442}, 135, 30 + soak.POOL_THREADS),
        ]
    )
    assert rows and all(rows.values())


def test_the_clients_pooled_connections_are_not_the_servers_fds() -> None:
    """Idle after the mix, the client may still hold pooled connections (httpx
    closes an idle one only when it next looks at its pool): not counted."""
    first = _sample(0, {1: 900, 2: 400}, 136, 30, clients=1)
    rows = _flat_rows(
        [first, _sample(90, {1: 900}, 150, 30), _sample(180, {1: 900}, 150, 30, 14)]
    )
    assert all(rows.values())
    rows = _flat_rows(
        [first, _sample(90, {1: 900}, 150, 30), _sample(180, {1: 900}, 150, 30, 4)]
    )
    assert [name for name, ok in rows.items() if not ok] == [
        name for name in rows if "open fds" in name
    ]


def test_fds_by_kind_of_a_real_process(tmp_path: Path) -> None:
    """The accepted end of a connection to the HTTP port is a client
    connection; the listener, the client's own end, a pipe and a file are
    not."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = listener.getsockname()[1]
        client = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        accepted = stack.enter_context(listener.accept()[0])
        before = soak._fd_kinds(psutil.Process(), port)
        stack.enter_context((tmp_path / "f").open("w"))
        read, write = os.pipe()
        stack.callback(os.close, read)
        stack.callback(os.close, write)
        after = soak._fd_kinds(psutil.Process(), port)
        assert client.fileno() != accepted.fileno()
    assert before["client connection"] == 1
    assert before["other socket"] >= 2  # the listener and the client's end
    assert after - before == Counter({"file": 1, "pipe": 2})


@pytest.mark.parametrize(
    ("last", "failing"),
    [
        (_sample(180, {1: 900, 2: 470}, 140, 34), "RSS"),
        (_sample(180, {1: 900, 2: 400}, 160, 34), "open fds"),
        (_sample(180, {1: 900, 2: 400}, 140, 35 + soak.POOL_THREADS), "threads"),
    ],
)
def test_second_half_checks_fail_on_growth(last: soak.Sample, failing: str) -> None:
    rows = _flat_rows(
        [
            _sample(0, {1: 900, 2: 400}, 140, 34),
            _sample(90, {1: 900, 2: 400}, 140, 34),
            last,
        ]
    )
    assert [name for name, ok in rows.items() if not ok] == [
        name for name in rows if failing in name
    ]


def _memory_rows(children: dict[str, float]) -> dict[str, bool]:
    """``_memory`` over processes that grew by ``children`` MiB since warm-up."""
    names = dict(enumerate(children, start=10))
    report = soak.Report(
        rss_warm=500 * soak.MiB,
        rss_after=510 * soak.MiB,
        children_warm={pid: (name, 100 * soak.MiB) for pid, name in names.items()},
        children_after={
            pid: (name, int((100 + children[name]) * soak.MiB))
            for pid, name in names.items()
        },
    )
    soak._memory(report)
    return {name: ok for name, _, _, ok in report.rows}


def test_engine_processes_have_their_own_bound() -> None:
    """vLLM's worker plateaus above our processes' bound; ours may not."""
    rows = _memory_rows({"python[10]": 10, "VLLM::Worker[11]": 60})
    assert all(rows.values()) and any("vLLM engine" in name for name in rows)
    rows = _memory_rows({"python[10]": 60, "VLLM::Worker[11]": 10})
    assert [n for n, ok in rows.items() if not ok] == [
        "largest RSS change of one of our processes since warm-up (MiB)"
    ]
    rows = _memory_rows({"python[10]": 10, "VLLM::EngineCore[11]": 150})
    assert [n for n, ok in rows.items() if not ok] == [
        "largest RSS change of a vLLM engine process since warm-up (MiB)"
    ]
