"""Numbers in user input are finite numbers: never true/false, never inf or NaN.

pydantic, left to itself, reads ``true`` as 1, accepts ``.inf`` and ``.nan`` and
lets NaN through every ``gt=0`` bound. ``StrictModel`` is the base of every
frozen model a user fills in (profiles, policy parameters, run configuration):
it refuses booleans where a number is expected (also inside lists and mappings)
and non-finite floats anywhere.

Numeric strings are accepted, consistently: PyYAML follows YAML 1.1, which reads
``80.0e9`` or ``1e3`` (an exponent without a sign) as a string, and the shipped
profiles write their large numbers that way. So a numeric field takes a string
that Python's ``int()`` or ``float()`` reads (an integer field: an integral
value, ``'1e3'`` is 1000) and refuses any other string, ``'inf'`` and ``'nan'``
included.

``Sourced`` builds on it for every profile object: each number a file sets is
named in the object's ``sources`` mapping (spec sheet, paper or measurement).
Platforms (``hwprofiles.schema``) and model specs (``hwprofiles.models``) are
Sourced.
"""

from __future__ import annotations

import math
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

_UNIONS = (Union, types.UnionType)
_SEQUENCES = (tuple, list)


def strict_numbers(value: Any, annotation: Any) -> Any:
    """``value`` with numeric strings read as numbers where ``annotation`` wants a
    number; ValueError for a boolean there. Other values pass unchanged (pydantic
    judges them)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is Any or annotation is bool:
        return value
    if origin is Annotated:
        return strict_numbers(value, args[0])
    if origin in _UNIONS:
        options = [a for a in args if a is not type(None)]
        return value if bool in options else strict_numbers(value, _option(options, value))
    if origin in _SEQUENCES and isinstance(value, (list, tuple)):
        return type(value)(strict_numbers(v, _item(args, i)) for i, v in enumerate(value))
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {k: strict_numbers(v, args[1]) for k, v in value.items()}
    if annotation in (int, float):
        return _number(value, annotation)
    return value


def _option(options: list, value: Any) -> Any:
    """The member of a union that a value of this shape would be validated as."""
    for option in options:
        origin = get_origin(option)
        if isinstance(value, (list, tuple)) and origin in _SEQUENCES:
            return option
        if isinstance(value, dict) and origin is dict:
            return option
    scalars = [o for o in options if get_origin(o) is None]
    if int in scalars and float not in scalars and isinstance(value, (int, float, str)):
        return int
    return float if float in scalars else (scalars[0] if scalars else Any)


def _item(args: tuple, index: int) -> Any:
    if not args:
        return Any
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return args[index] if index < len(args) else Any


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise ValueError("expects a number, not true/false; write the value in digits")
    if isinstance(value, int) and kind is float:
        try:
            return float(value)
        except OverflowError:
            raise ValueError("is too large to be a number hetspec can compute with; "
                             "check the value's unit") from None
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)  # 1e24 is refused by the field's range, not as unparsable
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return value  # pydantic names it: not a valid number
    if kind is int and math.isfinite(number) and number.is_integer():
        return int(number)
    return number


class StrictModel(BaseModel):
    """A frozen model with no unknown fields whose numbers are finite numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return value if field is None else strict_numbers(value, field.annotation)


class Frozen(StrictModel):
    """Frozen, no unknown fields, finite numbers (``StrictModel``)."""


class Sourced(Frozen):
    """An object whose numbers each name where they come from."""

    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _every_number_has_a_source(self):
        for name in self.model_fields_set:
            value = getattr(self, name)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            numeric = numeric or (isinstance(value, dict) and value and all(
                isinstance(v, (int, float)) for v in value.values()))
            if numeric and name not in self.sources:
                raise ValueError(
                    f"field '{name}' has no source; add sources.{name}: "
                    "'<spec sheet, paper or measurement>'")
        for name, text in self.sources.items():
            if name not in type(self).model_fields:
                raise ValueError(f"sources.{name} names no field of "
                                 f"{type(self).__name__}; fix the spelling or drop it")
            if not text.strip():
                raise ValueError(f"sources.{name} is empty; say where the number comes from")
        return self
