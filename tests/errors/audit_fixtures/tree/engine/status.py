"""Fixture: status-range guessing (OMNI004) and look-alikes that are not."""

from http import HTTPStatus

from vllm_omni.errors.compat import is_client_error_status as is_client


def chained(status):
    return 400 <= status < 500  # expect: OMNI004


def and_pair(x):
    return x >= 400 and x < 500  # expect: OMNI004


def floor_division(code):
    return code // 100 == 4  # expect: OMNI004


def floor_division_membership(resp):
    return resp.status_code // 100 in (4, 5)  # expect: OMNI004


def single_bound(exc):
    if exc.status_code >= 500:  # expect: OMNI004
        return "server"
    return "client"


def in_range(status_code):
    return status_code in range(400, 500)  # expect: OMNI004


def aliased_helper(code):
    return is_client(code)  # expect: OMNI004


def attribute(response):
    return response.is_server_error  # expect: OMNI004


def named_bounds(status):
    return HTTPStatus.BAD_REQUEST <= status < HTTPStatus.INTERNAL_SERVER_ERROR  # expect: OMNI004


def multi_line(error):
    return (
        error.code >= 400  # expect: OMNI004
        and error.code < 600
    )


def not_a_status(width, height, x):
    if width >= 500 or height < 400:
        return x // 10 == 4
    return 0 <= x < 100
