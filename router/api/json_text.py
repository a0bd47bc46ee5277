"""JSON going out of the api: characters as UTF-8, as Starlette writes them, except a lone
surrogate, which a model's tool-call JSON can spell with an escape ("\\ud800") and no UTF-8 text
holds: it stays an escape, instead of failing the answer with a 500."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse


def utf8_json(value: Any, **dumps: Any) -> bytes:
    """``json.dumps(value, **dumps)`` in UTF-8, non-ASCII characters unescaped where they can be."""
    try:
        return json.dumps(value, ensure_ascii=False, **dumps).encode()
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, **dumps).encode()


class JsonResponse(JSONResponse):
    """Starlette's JSONResponse, written by ``utf8_json``."""

    def render(self, content: Any) -> bytes:
        return utf8_json(content, allow_nan=False, indent=None, separators=(",", ":"))
