"""The base of every profile object: frozen, no unknown fields, finite numbers, and
each number a file sets named in the object's ``sources`` mapping (spec sheet,
paper or measurement). Platforms (``hwprofiles.schema``) and model specs
(``hwprofiles.models``) build on it.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from hwprofiles.numbers import StrictModel


class Frozen(StrictModel):
    """Frozen, no unknown fields, finite numbers (see hwprofiles.numbers)."""


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
