"""The gateway's aiohttp session to its replicas for all but the forwarded generations (polls,
snapshots, the other routes; those go through connections.py), answers read whole."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

CONNECT_TIMEOUT_S = 5.0
# a replica that cannot be reached, breaks a connection off or runs past a timeout
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def open_session() -> aiohttp.ClientSession:
    """The session every call to a replica goes through; opened inside the event loop that
    uses it. Generations run as long as they run: only connecting is bounded."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
    )


@dataclass(slots=True)
class Answer:
    """A replica's whole answer."""

    status: int
    content: bytes
    content_type: str | None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


async def fetch(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None = None,
    timeout: float | None = None,
) -> Answer:
    """One request, its answer read whole; ``timeout`` bounds all of it (UPSTREAM_ERRORS)."""
    bound = aiohttp.ClientTimeout(total=timeout, sock_connect=CONNECT_TIMEOUT_S)
    async with http.request(
        method, url, data=content, headers=headers, allow_redirects=False, timeout=bound
    ) as response:
        return Answer(response.status, await response.read(), response.headers.get("Content-Type"))
