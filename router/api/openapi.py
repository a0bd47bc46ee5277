"""One operationId per path and method in the OpenAPI document: FastAPI names every method of a
route after its first, and code generators and validators refuse a document with duplicates."""

from __future__ import annotations

import re
import warnings
from typing import Any

from fastapi import FastAPI


def distinct_operation_ids(app: FastAPI) -> None:
    """``app``'s /openapi.json with each operation's id ending in its own method."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        with warnings.catch_warnings():  # its warning of the duplicates this renames
            warnings.filterwarnings("ignore", "Duplicate Operation ID")
            schema = build()  # FastAPI keeps it as app.openapi_schema
        for operations in schema.get("paths", {}).values():
            for method, operation in operations.items():
                if "operationId" in operation:
                    operation["operationId"] = re.sub(r"_[a-z]+$", f"_{method}", operation["operationId"])
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
