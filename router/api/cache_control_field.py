"""``cache_control``, the OpenAI requests' extension field that pins a prefix of the prompt once it
is computed, in the shape clients already send for Anthropic models through OpenAI-compatible
gateways: ``{"type": "ephemeral", "ttl": "5m"}`` on a message or a content part (the chat up to
that message), or on the request (its whole prompt)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from radixcluster.router.api.cache_schemas import MAX_PIN_TTL_S

DEFAULT_TTL = "5m"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh])")


def ttl_seconds(value: Any) -> float:
    """A TTL in seconds from a number of seconds or a duration such as "90s", "5m", "1h"."""
    if isinstance(value, str):
        found = _DURATION.fullmatch(value.strip())
        if found is None:
            raise ValueError(f'ttl {value!r}: a number of seconds, or a duration such as "90s", "5m", "1h"')
        seconds = float(found[1]) * _UNITS[found[2]]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"ttl {value!r}: a number of seconds or a duration string")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_PIN_TTL_S):
        raise ValueError(f"ttl must be more than 0 and at most {MAX_PIN_TTL_S:g} seconds (a week), got {value!r}")
    return seconds


class CacheControlIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["ephemeral"] = "ephemeral"
    ttl: Annotated[float, BeforeValidator(ttl_seconds)] = ttl_seconds(DEFAULT_TTL)
