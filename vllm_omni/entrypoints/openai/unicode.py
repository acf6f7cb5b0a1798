"""The boundary check that everything a client sends is Unicode (docs/design.md §10).

``require_unicode`` is a FastAPI dependency that ``build_app`` puts on every
router, so it runs for every route, HTTP and WebSocket, present and future,
before the route's own code and before request validation: a lone surrogate
(``vllm_omni.errors.text``) in a header, a query or path parameter, a JSON
body (values and field names, unknown fields included) or a form (fields,
field names and file names) is a 400 ``BadRequestError`` whose ``param``
names the field. No such string reaches a route, a stage, the job store or a
log line. One exception keeps upstream's order of checks: a top-level
``model`` that is not Unicode names no served model, so it is the 404 any
unknown model gets, with the name made safe.

The check reads the body through the request's own cached parsers
(``Request.json`` / ``Request.form``), which FastAPI has already called for
a route with a body model, so the body is parsed once. A route that parses
its body itself (``POST /v1/videos``) finds it parsed here and cached. A
body that does not parse is left to the route, which refuses it in its own
words. Realtime events arrive after the handshake; the realtime route checks
each with the same ``non_unicode_field``.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import UploadFile
from starlette.requests import HTTPConnection, Request

from vllm_omni.entrypoints.openai.serving_common import unknown_model
from vllm_omni.errors import VLLMValidationError
from vllm_omni.errors.text import NonUnicode, is_unicode, non_unicode_field

__all__ = ["non_unicode_error", "require_unicode"]

_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
_BODY = "body"


def non_unicode_error(found: NonUnicode, where: str = _BODY) -> VLLMValidationError:
    """The 400 for text that is not Unicode at ``found`` (within ``where``)."""
    if found.in_name:
        place = f"in {found.path}" if found.path else f"in the {where}"
        return VLLMValidationError(
            f"A field name {place} is not valid Unicode (it holds a lone surrogate).",
            parameter=found.path or where,
        )
    return VLLMValidationError(
        f"{found.path} is not valid Unicode (it holds a lone surrogate).",
        parameter=found.path,
    )


def _check_model(document: object) -> None:
    # Upstream checks the model before anything else in the body: a name that
    # is not Unicode is an unknown model, answered as every unknown model is.
    model = document.get("model") if isinstance(document, dict) else None
    if isinstance(model, str) and not is_unicode(model):
        raise unknown_model(model)


def _check_pairs(pairs: Iterable[tuple[str, object]], where: str) -> None:
    for name, value in pairs:
        if not is_unicode(name):
            raise non_unicode_error(NonUnicode("", in_name=True), where)
        if isinstance(value, str) and not is_unicode(value):
            raise non_unicode_error(NonUnicode(name))


async def _json_body(request: Request) -> object:
    try:
        return await request.json()
    except (ValueError, RecursionError):
        # Not JSON (or nested past the decoder's limit): the route refuses it.
        return None


async def _form_fields(request: Request) -> list[tuple[str, object]]:
    # A malformed form raises Starlette's 400 here, as the route's own parse
    # would: once parsing failed, the stream is consumed and a second parse
    # (the route's) fails with RuntimeError, a 500.
    form = await request.form()
    fields: list[tuple[str, object]] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            if value.filename is not None and not is_unicode(value.filename):
                raise VLLMValidationError(
                    f"The file name of {name} is not valid Unicode (it holds a "
                    "lone surrogate).",
                    parameter=name if is_unicode(name) else None,
                )
            continue
        fields.append((name, value))
    return fields


async def require_unicode(conn: HTTPConnection) -> None:
    """Refuse a request any text of which is not Unicode: 400 naming the field."""
    _check_pairs(conn.headers.items(), "headers")
    _check_pairs(conn.query_params.multi_items(), "query")
    _check_pairs(conn.path_params.items(), "path")
    if not isinstance(conn, Request) or conn.method in ("GET", "HEAD", "OPTIONS"):
        return
    content_type = conn.headers.get("content-type", "").lower()
    if content_type.startswith(_FORMS):
        fields = await _form_fields(conn)
        _check_model(dict(fields))
        _check_pairs(fields, _BODY)
        return
    if not await conn.body():
        return
    document = await _json_body(conn)
    _check_model(document)
    found = non_unicode_field(document)
    if found is not None:
        raise non_unicode_error(found)
