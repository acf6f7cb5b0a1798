"""The 400 naming what a JSON schema does not admit, in the schema's words.

``first_error`` words the first error of a ``jsonschema_rs`` validator as a
``VLLMValidationError``: the field as ``param`` and what is wrong with it,
never the rejected value. ``wrong_json_type`` does it for a pydantic model's
own schema (the request models' before-validators use it). ``NOT_BLANK`` is
the one schema piece worded by its meaning ("must not be blank"), so it lives
here. Builds no documents (``openapi/``) and no responses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from vllm_omni.errors import VLLMValidationError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["BLANKS", "NOT_BLANK", "Schema", "first_error", "wrong_json_type"]

Schema = dict[str, Any]

# Characters ``str.strip()`` removes, which ``\s`` of the document's regex
# dialect does not all match: a string is blank when it has only these.
# Unicode's white space is all in the Basic Multilingual Plane.
_BLANK = "".join(chr(c) for c in range(0x10000) if chr(c).isspace())


def _char_class(characters: str, *, negate: bool = False) -> str:
    """A regex class of ``characters`` (as \\u escapes, in ranges)."""
    codes = sorted(ord(c) for c in characters)
    ranges: list[tuple[int, int]] = []
    for code in codes:
        if ranges and code == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    body = "".join(
        f"\\u{low:04x}" if low == high else f"\\u{low:04x}-\\u{high:04x}"
        for low, high in ranges
    )
    return f"[{'^' if negate else ''}{body}]"


# A regex of any run of blanks.
BLANKS = _char_class(_BLANK) + "*"
# Not blank: not only blanks. (Spelled with ``not``: a pattern beside a
# large ``maxLength`` makes schemathesis' generator crawl.)
NOT_BLANK: Schema = {"not": {"pattern": f"^{BLANKS}$"}}


def wrong_json_type(model: type[BaseModel], data: Any) -> VLLMValidationError | None:
    """The 400 naming the first field of ``data`` that ``model``'s own JSON
    schema does not admit, if any: for upstream's before-validators, which
    read raw fields before pydantic checks their types."""
    checker = _model_validators.get(model)
    if checker is None:
        schema = model.model_json_schema()
        checker = (jsonschema_rs.Draft202012Validator(schema), schema)
        _model_validators[model] = checker
    return first_error(*checker, data, {})


_model_validators: dict[type[BaseModel], tuple[jsonschema_rs.Validator, Schema]] = {}


def first_error(
    validator: jsonschema_rs.Validator,
    root: Schema,
    body: Any,
    formats: Mapping[str, str],
) -> VLLMValidationError | None:
    error = next(iter(validator.iter_errors(body)), None)
    if error is None:
        return None
    error = _most_specific(error)
    path = list(error.instance_path)
    name = _extra_name(error.kind)
    if name is not None:
        path.append(name)
    parameter = _parameter(path)
    reason = _reason(error.kind, formats, _at(root, error.schema_path))
    return VLLMValidationError(
        f"{parameter} {reason}" if parameter else f"The request {reason}",
        parameter=parameter or None,
    )


def _most_specific(error: jsonschema_rs.ValidationError) -> Any:
    """Inside ``anyOf``/``oneOf``, the error of the branch that got furthest
    (the deepest path, a value check before a type check), unless every
    branch failed at the value's type."""
    context = getattr(error.kind, "context", None)
    if not context:
        return error
    candidates = [_most_specific(branch[0]) for branch in context if branch]
    if not candidates:
        return error

    def depth(candidate: Any) -> tuple[int, bool]:
        return (
            len(candidate.instance_path),
            not isinstance(candidate.kind, jsonschema_rs.ValidationErrorKind.Type),
        )

    best = max(candidates, key=depth)
    if depth(best) <= (len(error.instance_path), False):
        return error
    return best


def _extra_name(kind: Any) -> str | None:
    kinds = jsonschema_rs.ValidationErrorKind
    if isinstance(kind, kinds.Required):
        return str(kind.property)
    if isinstance(kind, kinds.AdditionalProperties) and kind.unexpected:
        return str(kind.unexpected[0])
    return None


def _parameter(path: Iterable[str | int]) -> str:
    """A JSON instance path as vLLM writes a ``param``: dotted, a list index
    as a segment (``messages.0.content``)."""
    return ".".join(str(step) for step in path)


def _at(root: Schema, path: Iterable[str | int]) -> Any:
    """The schema at ``path`` in ``root`` (an error's ``schema_path``, with
    references already followed), or None where the path leaves it."""
    node: Any = root
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _reason(kind: Any, formats: Mapping[str, str], schema: Any = None) -> str:
    """What is wrong, in the schema's words: never the rejected value."""
    kinds = jsonschema_rs.ValidationErrorKind
    if isinstance(kind, kinds.Type):
        return f"must be of type {' or '.join(_types(kind))}"
    if isinstance(kind, kinds.Minimum):
        return f"must be at least {kind.limit}"
    if isinstance(kind, kinds.Maximum):
        return f"must be at most {kind.limit}"
    if isinstance(kind, kinds.MinLength):
        return f"must have at least {kind.limit} characters"
    if isinstance(kind, kinds.MaxLength):
        return f"must have at most {kind.limit} characters"
    if isinstance(kind, kinds.MinItems):
        return f"must have at least {kind.limit} items"
    if isinstance(kind, kinds.MaxItems):
        return f"must have at most {kind.limit} items"
    if isinstance(kind, kinds.Enum):
        return "must be one of " + ", ".join(_json(option) for option in kind.options)
    if isinstance(kind, kinds.Constant):
        return f"must be {_json(kind.expected_value)}"
    if isinstance(kind, kinds.Not) and kind.schema == NOT_BLANK["not"]:
        return "must not be blank"
    if isinstance(kind, kinds.Pattern):
        meaning = formats.get(kind.pattern)
        return f"must be {meaning}" if meaning else "has the wrong format"
    if isinstance(kind, kinds.Required):
        return "is required"
    if isinstance(kind, kinds.AdditionalProperties | kinds.FalseSchema):
        return "is not accepted here"
    if isinstance(kind, kinds.Contains):
        # ``schema`` is what one item must be.
        if isinstance(schema, dict) and "const" in schema:
            return f"must include {_json(schema['const'])}"
        return "must contain an accepted item"
    if isinstance(kind, kinds.AnyOf | kinds.OneOfNotValid):
        # Every form failed at the value's type (else a deeper error is named).
        types = [
            name
            for branch in kind.context
            for error in branch
            if isinstance(error.kind, kinds.Type)
            for name in _types(error.kind)
        ]
        if types:
            return f"must be of type {' or '.join(dict.fromkeys(types))}"
    return "is not valid here"


def _types(kind: Any) -> list[str]:
    types = getattr(kind, "types", None)
    return [str(t) for t in types] if types else ["another type"]


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
