"""The forwarded requests' HTTP/1.1 client: keep-alive connections to each replica, reused, their
answers parsed by httptools (aiohttp's machinery cost more CPU per request than all the rest)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 5.0
# a streamed answer waiting for a slow client stops being read from the replica past this
HIGH_WATER_BYTES = 256 * 1024


class UpstreamError(Exception):
    """The connection to a replica could not be made, or broke before the answer's end."""


class Exchange(asyncio.Protocol):
    """One connection, and the answer to the request it carries now (one at a time)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self.status = 0
        self.content_type: str | None = None
        self._headed = False
        self._until_eof = True  # no Content-Length and not chunked: the answer ends with the connection
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._keep_alive = False

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._headed and self._until_eof and not self._complete and exc is None:
            self._complete = True
            self._wake()
        self._fail(UpstreamError(f"connection closed: {exc}" if exc else "connection closed by the replica"))

    # ------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding"):
            self._until_eof = False

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._headed = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # ------------------------------------------------------------ the answer

    @property
    def reusable(self) -> bool:
        """Its answer came whole and the replica keeps the connection open for the next one."""
        return self._complete and self._keep_alive and self._error is None and self._transport is not None

    def send(self, request: bytes) -> None:
        assert self._transport is not None
        self.status, self.content_type, self._headed, self._until_eof = 0, None, False, True
        self._chunks, self._buffered, self._complete, self._keep_alive = [], 0, False, False
        self._transport.write(request)

    async def headers(self) -> None:
        """Until the status line and headers have come (UpstreamError if the connection ends first)."""
        while not self._headed:
            await self._wait()

    async def read(self) -> bytes:
        """The whole body."""
        while not self._complete:
            await self._wait()
        return b"".join(self._chunks)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines as they arrive, without their line ends (any length)."""
        pending = b""
        while True:
            if self._chunks:
                data, self._chunks, self._buffered = b"".join(self._chunks), [], 0
                if self._paused and self._transport is not None:
                    self._transport.resume_reading()
                    self._paused = False
                *complete, pending = (pending + data).split(b"\n")
                for line in complete:
                    yield line.rstrip(b"\r")
            elif self._complete:
                break
            else:
                await self._wait()
        if pending:
            yield pending.rstrip(b"\r")

    def close(self) -> None:
        """Drop the connection (a replica sees its client leave and aborts the request)."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    # ------------------------------------------------------------ waiting

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()


class ConnectionPool:
    """Idle keep-alive connections per replica, made as needed, never bounded in number."""

    def __init__(self) -> None:
        self._idle: dict[str, list[Exchange]] = {}
        self._targets: dict[str, tuple[str, int, ssl.SSLContext | None, str, str]] = {}

    async def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str]) -> Exchange:
        """Send ``body`` to ``base_url + path``; the exchange once its answer's headers came.
        Give it back with ``release``. UpstreamError if the replica was not reached or the
        connection ended before an answer."""
        host, port, tls, prefix, netloc = self._target(base_url)
        lines = [f"POST {prefix}{path} HTTP/1.1", f"Host: {netloc}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        request = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
        idle = self._idle.get(base_url)
        while idle:
            exchange = idle.pop()
            if exchange.reusable:
                try:
                    return await self._exchange(exchange, request)
                except UpstreamError:
                    # the replica closed it while idle, as the request left: it never read it
                    break
        exchange = await self._connect(host, port, tls)
        return await self._exchange(exchange, request)

    def release(self, base_url: str, exchange: Exchange) -> None:
        """Back to the idle connections if its answer was read whole and it stays open;
        closed otherwise (an answer left unread: the replica aborts the request)."""
        if exchange.reusable:
            self._idle.setdefault(base_url, []).append(exchange)
        else:
            exchange.close()

    def drop(self, base_url: str) -> None:
        """Close the idle connections to a replica that left."""
        for exchange in self._idle.pop(base_url, []):
            exchange.close()

    def close(self) -> None:
        for base_url in list(self._idle):
            self.drop(base_url)

    async def _exchange(self, exchange: Exchange, request: bytes) -> Exchange:
        exchange.send(request)
        try:
            await exchange.headers()
        except BaseException:
            exchange.close()  # cancelled (the client left) or broken
            raise
        return exchange

    async def _connect(self, host: str, port: int, tls: ssl.SSLContext | None) -> Exchange:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, exchange = await loop.create_connection(Exchange, host, port, ssl=tls)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {type(exc).__name__}: {exc}") from None
        return exchange

    def _target(self, base_url: str) -> tuple[str, int, ssl.SSLContext | None, str, str]:
        found = self._targets.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            tls = ssl.create_default_context() if parts.scheme == "https" else None
            port = parts.port or (443 if tls else 80)
            found = self._targets[base_url] = (parts.hostname or "", port, tls, parts.path.rstrip("/"), parts.netloc)
        return found
