"""A structural tag (SGLang's ``structural_tag`` sampling parameter, the ``response_format`` of
type ``structural_tag`` in SGLang's and vLLM's OpenAI routes): xgrammar's ``format`` object, or
the older ``structures`` + ``triggers`` form, read as the triggered tags it stands for."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from radixcluster.router.api.field_error import FieldError


class TagStructureIn(BaseModel):
    """One tag of the older form: free text until a trigger, then ``begin``, a JSON document
    under ``schema`` (any text up to ``end`` without one), then ``end``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    begin: str = Field(min_length=1)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    end: str

    def as_tag(self) -> dict[str, Any]:
        content = {"type": "any_text"} if self.schema_ is None else {"type": "json_schema", "json_schema": self.schema_}
        return {"type": "tag", "begin": self.begin, "content": content, "end": self.end}


class StructuralTagFields(BaseModel):
    """A structural tag's fields in either form, beside its ``type`` (a response_format's
    ``type`` names other formats too: the fields are read only under ``structural_tag``)."""

    type: str
    format: dict[str, Any] | None = None
    structures: list[TagStructureIn] | None = Field(None, min_length=1)
    triggers: list[str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> StructuralTagFields:
        if self.type != "structural_tag":
            return self
        if self.format is not None and (self.structures is not None or self.triggers is not None):
            raise FieldError("format", "a structural tag takes either format or structures and triggers, not both")
        if self.format is None and (self.structures is None or self.triggers is None):
            missing = "triggers" if self.structures is not None else "structures"
            raise FieldError(missing, f"a structural tag needs format, or structures and triggers (no {missing} given)")
        if self.triggers is not None and any(not trigger for trigger in self.triggers):
            raise FieldError("triggers", "a trigger must not be empty")
        for i, structure in enumerate(self.structures or []):
            if not any(structure.begin.startswith(trigger) for trigger in self.triggers or []):
                raise FieldError(f"structures.{i}.begin", f"{structure.begin!r} starts with none of the triggers")
        for trigger in self.triggers or []:
            if not any(structure.begin.startswith(trigger) for structure in self.structures or []):
                raise FieldError("triggers", f"no structure's begin starts with the trigger {trigger!r}")
        return self

    @cached_property
    def structural_tag_spec(self) -> str:
        """The tag as xgrammar's structural tag JSON (its ``format`` form), which the router
        compiles (made once: the request's size check and its sampling parameters both read it)."""
        if self.format is None:
            tags = [structure.as_tag() for structure in self.structures or []]
            form = {"type": "triggered_tags", "triggers": self.triggers, "tags": tags}
        else:
            form = self.format
        return json.dumps({"type": "structural_tag", "format": form})


class StructuralTagIn(StructuralTagFields):
    """A structural tag given whole (SGLang's sampling parameter, vLLM's ``structured_outputs``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["structural_tag"] = "structural_tag"


def _parsed(value: Any) -> Any:
    """SGLang's and vLLM's clients send the tag as JSON text: parsed, for the model to validate."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"structural_tag is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("structural_tag is nested too deeply") from None


# a structural tag, or its JSON text
StructuralTag = Annotated[StructuralTagIn | None, BeforeValidator(_parsed)]
