"""The base of every config section: unknown keys are errors, values are checked on
assignment, and a number is never read from true or false. The sections are in `config.py`
(and the data section in `config_data.py`)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _number_kind(annotation: Any) -> str | None:
    """'an integer' or 'a number' when a field of this type holds numbers (optionally None, or
    a tuple of them), None otherwise (a bool, a string, a section ...)."""
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        kinds = {_number_kind(arg) for arg in typing.get_args(annotation) if arg is not type(None) and arg is not ...}
        if len(kinds) == 1:
            return kinds.pop()
    return None

class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A number is never read from true/false (YAML's `yes`, `on` ...), which pydantic
        would take as 1 or 0."""
        kind = _number_kind(cls.model_fields[info.field_name].annotation) if info.field_name else None
        items = value if isinstance(value, (list, tuple)) else [value]
        if kind is not None and any(isinstance(v, bool) for v in items):
            raise ValueError(f"expected {kind}, not true or false")
        return value
