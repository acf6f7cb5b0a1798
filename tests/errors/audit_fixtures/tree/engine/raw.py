"""Fixture: raw raises (OMNI001) and the forms that are not findings."""

import abc
import builtins
from typing import TYPE_CHECKING

from pydantic import BaseModel, field_validator

from vllm_omni.errors import OmniNotImplementedError, VLLMNotFoundError

VE = ValueError

if TYPE_CHECKING:
    raise ValueError("never at runtime")


def plain(x):
    if x is None:
        raise ValueError("x must not be None")  # expect: OMNI001
    if not isinstance(x, int):
        raise TypeError  # expect: OMNI001
    if x > 2**63:
        raise OverflowError("too big")  # expect: OMNI001
    raise NotImplementedError(f"mode {x} is not implemented")  # expect: OMNI001


def qualified_and_aliased():
    try:
        raise builtins.ValueError("qualified")  # expect: OMNI001
    except KeyError as exc:
        raise VE("aliased") from exc  # expect: OMNI001


def nested():
    def inner():
        raise ValueError("inner")  # expect: OMNI001

    class Local:
        def method(self):
            raise TypeError("method")  # expect: OMNI001

    return inner, Local


def reraise():
    try:
        plain(1)
    except ValueError:
        raise
    except TypeError as exc:
        raise exc


def inventory_only(name):
    if name == "a":
        raise RuntimeError("invariant broken")
    if name == "b":
        raise KeyError(name)
    if name == "c":
        raise Exception("anything")
    raise VLLMNotFoundError(f"no model {name}")


def dispatch(command):
    match command:
        case "a":
            raise ValueError("a")  # expect: OMNI001
        case _:
            pass
    try:
        pass
    except* OSError:
        raise TypeError("grouped")  # expect: OMNI001
    with open(command) as handle:
        for line in handle:
            while line:
                raise OverflowError(line)  # expect: OMNI001


class Base(abc.ABC):
    @abc.abstractmethod
    def run(self):
        raise NotImplementedError

    @abc.abstractmethod
    def wrong_type(self):
        raise ValueError("abstract bodies are exempt for NotImplementedError only")  # expect: OMNI001

    def not_abstract(self):
        raise NotImplementedError  # expect: OMNI001

    def explicit(self):
        raise OmniNotImplementedError("the semantic type")


class Request(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def positive(cls, value):
        if value < 1:
            raise ValueError("pydantic turns this into a ValidationError")
        if value > 10:
            raise TypeError("pydantic does not convert TypeError")  # expect: OMNI001
        return value


def __getattr__(name):
    raise AttributeError(name)


def hints(model):
    if model is None:
        raise ValueError(f"model {model} not found")  # expect: OMNI001
    raise ValueError("request timed out")  # expect: OMNI001
