"""The Ray failure table in docs/errors/stages.md is the one in the code."""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engine.ray_backend import RAY_FAILURES, RAY_PROBE_FAILURES, describe_exit

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "stages.md"
# Fatal rows that are not a Ray exception: the reasons the code gives itself.
_OWN_FATAL = {
    "the worker returned by itself": describe_exit(None, 0),
    "the stage silent for `heartbeat_timeout_s`": "stage heartbeat lost",
}
# Status cell of a probe failure, by who is unavailable.
_PROBE_STATUS = {"stage": "504 `GatewayTimeoutError`", "cluster": "503 "}


def _rows() -> dict[str, list[str]]:
    section = DOC.read_text().split("### Ray failures", 1)[1].split("\n### ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = cells[0]
            rows[name[1:-1] if name.count("`") == 2 and name[0] == "`" else name] = (
                cells
            )
    return rows


def test_every_ray_failure_is_documented_with_its_reason() -> None:
    rows = _rows()
    for name, reason in RAY_FAILURES.items():
        assert rows[name][-1] == reason, name
        assert rows[name][2:4] == ["500, fatal", "server"]
    documented = {name for name, cells in rows.items() if cells[2] == "500, fatal"}
    assert documented - set(_OWN_FATAL) == set(RAY_FAILURES)


def test_fatal_reasons_of_our_own_are_documented() -> None:
    rows = _rows()
    for name, reason in _OWN_FATAL.items():
        assert rows[name][2:4] == ["500, fatal", "server"], name
        assert rows[name][-1] == reason, name


def test_request_time_failures_are_documented_with_status_and_stage() -> None:
    rows = _rows()
    for name, (who, reason) in RAY_PROBE_FAILURES.items():
        cells = rows[name]
        assert cells[1].startswith("request time: "), name
        assert cells[2].startswith(_PROBE_STATUS[who]), name
        assert "503 `ServiceUnavailableError` with `Retry-After`" in cells[2], name
        assert cells[3] == "server"
        assert cells[4] == (
            "the silent stage" if who == "stage" else "the request's first stage"
        )
        assert cells[-1] == reason
