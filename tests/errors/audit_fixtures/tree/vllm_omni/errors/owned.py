"""Fixture: inside vllm_omni/errors, building statuses is the package's job."""

from fastapi import HTTPException
from fastapi.responses import JSONResponse


def render(status):
    if 400 <= status < 500:
        raise HTTPException(status)
    raise ValueError("raw raises are findings here too")  # expect: OMNI001


def fallback(call):
    try:
        return call()
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc


def envelope(message):
    return JSONResponse({"error": {"message": message}})
