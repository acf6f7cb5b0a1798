"""Fixture: HTTP-layer anti-patterns (OMNI002, OMNI003, OMNI005)."""

from http import HTTPStatus

import fastapi
import starlette.exceptions as se
from fastapi import HTTPException as E
from fastapi import status
from fastapi.responses import JSONResponse

from vllm_omni.errors import OmniClientError, VLLMValidationError

BAD_INPUT = (ValueError, TypeError)


def alias_call():
    raise E(404, "missing")  # expect: OMNI005


def module_attribute():
    raise fastapi.HTTPException(status_code=409)  # expect: OMNI005


def starlette_alias():
    raise se.HTTPException(503)  # expect: OMNI005


def class_raised_bare():
    raise fastapi.HTTPException  # expect: OMNI005


def constructed_not_raised():
    error = E(status.HTTP_422_UNPROCESSABLE_ENTITY)  # expect: OMNI005
    return error


def except_value_error(parse):
    try:
        return parse()
    except ValueError as exc:  # expect: OMNI002
        raise E(400, str(exc)) from exc  # expect: OMNI005


def except_tuple(parse):
    try:
        return parse()
    except (KeyError, TypeError):  # expect: OMNI002
        return JSONResponse({"error": "bad"}, status_code=HTTPStatus.BAD_REQUEST)


def except_alias_tuple(parse):
    try:
        return parse()
    except BAD_INPUT as exc:  # expect: OMNI002
        raise VLLMValidationError(str(exc), parameter="x") from exc


def except_compat_client_error(parse):
    try:
        return parse()
    except (OmniClientError, ValueError) as exc:  # expect: OMNI002
        raise OmniClientError(str(exc)) from exc


def except_nested_branch(self, parse):
    try:
        return parse()
    except Exception as exc:  # expect: OMNI002
        if self.strict:
            raise
        return self.create_error_response(str(exc))  # expect: OMNI003


def bare_except(parse):
    try:
        return parse()
    except:  # expect: OMNI002  # noqa: E722
        raise VLLMValidationError("bad request")


def except_star(parse):
    try:
        return parse()
    except* ValueError:  # expect: OMNI002
        raise E(status_code=status.HTTP_400_BAD_REQUEST)  # expect: OMNI005


def except_server_error_is_fine(parse):
    try:
        return parse()
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=500)


def except_nested_function_is_not_the_handler(parse):
    try:
        return parse()
    except ValueError:

        def later():
            raise VLLMValidationError("raised later, not by the handler")

        return later


def narrow_except_is_fine(lookup):
    try:
        return lookup()
    except KeyError as exc:
        raise VLLMValidationError("unknown key", parameter="key") from exc


def returns_error_model(ErrorResponse, ErrorInfo):
    return ErrorResponse(error=ErrorInfo(message="m", type="NotFound", code=404))  # expect: OMNI003


async def returns_awaited(self):
    return await self.create_error_response("bad", status_code=HTTPStatus.NOT_FOUND)  # expect: OMNI003


def error_json_without_status(exc):
    return JSONResponse(content={"error": {"message": str(exc)}})  # expect: OMNI003


def error_json_with_status(exc):
    return JSONResponse(content={"error": {"message": str(exc)}}, status_code=400)


def error_object_without_status(error_response):
    return JSONResponse(error_response.model_dump())  # expect: OMNI003


def plain_json_is_fine():
    return JSONResponse({"status": "ok"})


def other_http_exception_is_fine():
    from werkzeug.exceptions import HTTPException as WerkzeugHTTPException

    raise WerkzeugHTTPException()
