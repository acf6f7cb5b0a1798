"""JSON-Schema building blocks: the stages' grammars as regexes, ranges,
text, sizes, nullable fields and refused ones, conditional rules.

Pure functions of their arguments: no route, no pipeline, no app.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vllm_omni.entrypoints.openai.schema_errors import BLANKS, NOT_BLANK, Schema
from vllm_omni.stages.ranges import (
    SIZE_STEP,
    Choices,
    Integers,
    Numbers,
    ParamRange,
    Sizes,
)

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

__all__ = [
    "NULL",
    "accepted",
    "admits_null",
    "decimal_pattern",
    "if_set",
    "integers",
    "like",
    "nonblank_text",
    "numbers",
    "only_default",
    "requires",
    "size_pattern",
    "sizes",
]


# -- patterns of the stages' grammars ---------------------------------------------


def _fixed_width(low: str, high: str) -> list[list[str]]:
    """Regex digit classes, one list per alternative, matching exactly the
    digit strings of this width from ``low`` to ``high``."""
    if not low:
        return [[]]
    if low[0] == high[0]:
        return [[low[0], *rest] for rest in _fixed_width(low[1:], high[1:])]
    width = len(low) - 1
    first, last = int(low[0]), int(high[0])
    lower: list[list[str]] = []
    upper: list[list[str]] = []
    if low[1:] != "0" * width:
        lower = [[low[0], *rest] for rest in _fixed_width(low[1:], "9" * width)]
        first += 1
    if high[1:] != "9" * width:
        upper = [[high[0], *rest] for rest in _fixed_width("0" * width, high[1:])]
        last -= 1
    middle = []
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        middle = [[digit, *["[0-9]"] * width]]
    return lower + middle + upper


def _integer_digits(low: int, high: int) -> list[list[str]]:
    """Digit classes of the integers from ``low`` to ``high`` (no sign, no
    leading zero)."""
    alternatives: list[list[str]] = []
    for width in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (width - 1) if width > 1 else 0)
        last = min(high, 10**width - 1)
        if first <= last:
            alternatives += _fixed_width(str(first), str(last))
    return alternatives


def decimal_pattern(
    low: float, high: float, *, int_digits: int, frac_digits: int
) -> str:
    """A regex of the decimals ``I[.F]`` from ``low`` to ``high``: ``I`` of 1
    to ``int_digits`` digits (leading zeros allowed), ``F`` of 1 to
    ``frac_digits``, surrounded by blanks (``str.strip`` removes them)."""
    alternatives = []
    for places in range(frac_digits + 1):
        scale = 10**places
        first = math.ceil(round(low * scale, 9))
        last = math.floor(round(high * scale, 9))
        for digits in _integer_digits(first, last):
            # At least one integer digit: 5 hundredths is 0.05.
            digits = ["0"] * max(0, places + 1 - len(digits)) + digits
            head = digits[: len(digits) - places]
            tail = digits[len(digits) - places :]
            spare = int_digits - len(head)
            if spare < 0:
                continue
            zeros = f"0{{0,{spare}}}" if spare else ""
            fraction = r"\." + "".join(tail) if places else ""
            alternatives.append(zeros + "".join(head) + fraction)
    return f"^{BLANKS}(?:{'|'.join(alternatives)}){BLANKS}$"


def size_pattern(
    low: int,
    high: int,
    *,
    step: int = SIZE_STEP,
    digits: int = 5,
    times: str = "xX",
) -> str:
    """A regex of the sizes ``parse_size`` accepts: ``WxH`` (the ``x`` one of
    ``times``), each side from ``low`` to ``high`` and a multiple of
    ``step``, written with at most ``digits`` digits (leading zeros
    allowed)."""
    by_width: dict[int, list[str]] = {}
    for side in range(-(-low // step) * step, high + 1, step):
        by_width.setdefault(len(str(side)), []).append(str(side))
    side = "|".join(
        f"0{{0,{digits - width}}}(?:{'|'.join(sides)})"
        for width, sides in by_width.items()
    )
    return f"^(?:{side})[{times}](?:{side})$"


# -- schema pieces -----------------------------------------------------------------

NULL: Schema = {"type": "null"}


def integers(low: int, high: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


def numbers(low: float, high: float) -> Schema:
    return {"type": "number", "minimum": low, "maximum": high}


def nonblank_text(max_length: int, what: str) -> Schema:
    return {
        "type": "string",
        **NOT_BLANK,
        "maxLength": max_length,
        "description": f"{what}: not blank, at most {max_length} characters",
    }


def sizes(size: Sizes, times: str = "xX") -> Schema:
    return {
        "type": "string",
        "pattern": size_pattern(size.low, size.high, step=size.step, times=times),
        "description": f"WxH, each side from {size.low} to {size.high} and a "
        f"multiple of {size.step}",
    }


def accepted(value: ParamRange) -> Schema:
    """The schema of what a stage accepts for a parameter (its published
    range): a stage's own entry of ``sampling_params_list``."""
    if isinstance(value, Integers):
        return integers(value.low, value.high)
    if isinstance(value, Numbers):
        return numbers(value.low, value.high)
    if isinstance(value, Choices):
        return {"enum": list(value.values)}
    if isinstance(value, Sizes):
        return sizes(value)
    non_empty = {"type": "string", "minLength": 1}
    return {
        "anyOf": [
            non_empty,
            {"type": "array", "items": non_empty, "maxItems": value.max_items},
        ]
    }


def admits_null(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return schema is True
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(
        admits_null(branch)
        for keyword in ("anyOf", "oneOf")
        for branch in schema.get(keyword, ())
    )


def like(original: Schema, domain: Schema) -> Schema:
    """``domain``, or null where the model admits null (the field's default)."""
    if not admits_null(original):
        return domain
    return {"anyOf": [domain, NULL]}


def _default(original: Schema, field: FieldInfo | None) -> list[Any]:
    """The field's default, if it has one the client can send (a factory's
    counts when it is the same every time: ``[]``, not a fresh id)."""
    if field is not None and field.default_factory is not None:
        first = field.get_default(call_default_factory=True)
        same = first == field.get_default(call_default_factory=True)
        return [first] if same and first is not None else []
    default = original.get("default")
    return [] if default is None else [default]


def only_default(
    original: Schema, field: FieldInfo | None, reason: str, *, form: bool
) -> Schema | bool:
    """A refused field: its default, or null where the model admits it; a
    field without either may not be sent at all (``false``)."""
    values: list[Any] = []
    if admits_null(original) and not form:
        values.append(None)
    values += _default(original, field)
    if not values:
        return False
    return {"enum": values, "description": f"Refused on this pipeline: {reason}."}


def if_set(name: str, value: Schema, then: Schema) -> Schema:
    """``then`` applies when the request sets ``name`` to a ``value``."""
    return {
        "if": {"required": [name], "properties": {name: value}},
        "then": then,
    }


def requires(name: str, value: Schema) -> Schema:
    return {"required": [name], "properties": {name: value}}
