"""A validator's refusal that names the request field at fault: a model validator's error has no
location of its own, and OpenAI's ``param`` names the field."""

from __future__ import annotations


class FieldError(ValueError):
    """A ValueError about ``field`` (a dotted path from the model that raised it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
