"""The ``gateway_tokens`` field a gateway adds to the bodies it forwards: the ids it tokenized
each text prompt (or the chat) into, so that the replica does not tokenize the same text again.
The replica's router takes them only when its tokenizer has the same fingerprint; they give a
client nothing it could not send as ``input_ids``."""

from __future__ import annotations

import base64
import binascii

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from radixcluster.protocol import PromptTokens

MAX_FINGERPRINT_CHARS = 64


def pack_ids(ids: np.ndarray) -> str:
    """Token ids as the field carries them: base64 of little-endian int32s."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode("ascii")


class GatewayTokensIn(BaseModel):
    """``prompts``: one entry per prompt of the request, in its order: the packed ids of a text
    prompt (``pack_ids``), or null for one the client gave as ids. ``tokenizer``: the
    fingerprint of the tokenizer that made them."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: str = Field(max_length=MAX_FINGERPRINT_CHARS)
    prompts: list[str | None]
    _ids: list[np.ndarray | None] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _unpack(self) -> GatewayTokensIn:
        for i, packed in enumerate(self.prompts):
            if packed is None:
                self._ids.append(None)
                continue
            try:
                raw = base64.b64decode(packed, validate=True)
            except binascii.Error:
                raise ValueError(f"gateway_tokens.prompts[{i}] is not base64") from None
            if not raw or len(raw) % 4:
                raise ValueError(f"gateway_tokens.prompts[{i}] does not hold whole int32 token ids")
            self._ids.append(np.frombuffer(raw, dtype="<i4").astype(np.int32))
        return self

    def check_count(self, prompts: int) -> None:
        """ValueError unless there is one entry per prompt of the request."""
        if len(self.prompts) != prompts:
            raise ValueError(f"gateway_tokens has {len(self.prompts)} entries for {prompts} prompts")

    def for_prompt(self, index: int) -> PromptTokens | None:
        ids = self._ids[index]
        return None if ids is None else PromptTokens(self.tokenizer, ids)


def prompt_tokens(field: GatewayTokensIn | None, index: int) -> PromptTokens | None:
    """Prompt ``index``'s ids from a request's ``gateway_tokens``, if it has them."""
    return None if field is None else field.for_prompt(index)
