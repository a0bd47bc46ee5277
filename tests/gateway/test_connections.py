"""The forwarded requests' connection pool against a real HTTP server on a socket (asyncio's,
answering what each test scripts): keep-alive reuse, a connection the server closed while
idle, chunked and until-close bodies read whole or line by line, a replica nobody answers at."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from radixcluster.gateway.connections import ConnectionPool, UpstreamError
from support.servers import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


async def serve(script: Script, client: Callable[[str, ConnectionPool], Awaitable[None]]) -> list[bytes]:
    """Run ``client`` against a server whose ``script`` answers each connection (numbered
    from 0); the requests the server read, in order."""
    requests: list[bytes] = []
    accepted = 0

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        number, accepted = accepted, accepted + 1

        async def read() -> bytes:
            requests.append(await read_request(reader))
            return requests[-1]

        reader.read_request = read  # type: ignore[attr-defined]
        try:
            await script(number, reader, writer)
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool()
    try:
        await client(f"http://127.0.0.1:{port}", pool)
    finally:
        pool.close()
        server.close()
    return requests


async def keep_alive(_: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await reader.read_request()  # type: ignore[attr-defined]
        writer.write(OK)


def test_a_connection_is_reused_and_the_request_is_sent_as_given() -> None:
    seen: list[int] = []

    async def count(number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(number)
        await keep_alive(number, reader, writer)

    async def client(url: str, pool: ConnectionPool) -> None:
        for _ in range(3):
            answer = await pool.post(url, "/generate", b'{"text": "hi"}', {"Authorization": "Bearer k"})
            assert (answer.status, answer.content_type, await answer.read()) == (200, "application/json", b"{}")
            pool.release(url, answer)

    requests = asyncio.run(serve(count, client))
    assert seen == [0] and len(requests) == 3
    assert requests[0].startswith(b"POST /generate HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in requests[0] and requests[0].endswith(b'\r\n\r\n{"text": "hi"}')


def test_a_connection_the_server_dropped_while_idle_is_replaced() -> None:
    async def first_drops(number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read_request()  # type: ignore[attr-defined]
        writer.write(OK)
        if number > 0:
            await keep_alive(number, reader, writer)
        else:  # keep-alive promised, then the next request is read and dropped unanswered
            await reader.read_request()  # type: ignore[attr-defined]

    async def client(url: str, pool: ConnectionPool) -> None:
        for _ in range(2):
            answer = await pool.post(url, "/generate", b"{}", {})
            assert await answer.read() == b"{}"
            pool.release(url, answer)

    assert len(asyncio.run(serve(first_drops, client))) == 3  # the dropped one sent again


def test_chunked_and_until_close_bodies_are_read_whole_and_by_lines() -> None:
    async def stream(number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read_request()  # type: ignore[attr-defined]
        if number == 0:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (b"data: 1\n\nda", b"ta: 2\r\n\r\n", b"data: [DONE]"):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\ndraining")

    async def client(url: str, pool: ConnectionPool) -> None:
        answer = await pool.post(url, "/generate", b"{}", {})
        assert [line async for line in answer.lines()] == [b"data: 1", b"", b"data: 2", b"", b"data: [DONE]"]
        assert answer.reusable
        answer.close()  # the next request needs a connection of its own
        answer = await pool.post(url, "/generate", b"{}", {})
        assert (answer.status, await answer.read(), answer.reusable) == (503, b"draining", False)

    asyncio.run(serve(stream, client))


def test_a_replica_that_does_not_answer_is_an_upstream_error() -> None:
    async def client() -> None:
        pool = ConnectionPool()
        with pytest.raises(UpstreamError, match="cannot connect"):
            await pool.post(f"http://127.0.0.1:{free_port()}", "/generate", b"{}", {})

    asyncio.run(client())

    async def hangs_up(_: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read_request()  # type: ignore[attr-defined]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")

    async def cut_short(url: str, pool: ConnectionPool) -> None:
        answer = await pool.post(url, "/generate", b"{}", {})
        with pytest.raises(UpstreamError, match="closed"):
            await answer.read()

    asyncio.run(serve(hangs_up, cut_short))


def test_a_stream_read_slowly_pauses_the_replica_and_resumes_whole() -> None:
    line = b"data: " + b"x" * 1000 + b"\n"

    async def floods(_: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read_request()  # type: ignore[attr-defined]
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(600):  # 600 KB: past the high-water mark while the client sleeps
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def slow(url: str, pool: ConnectionPool) -> None:
        answer = await pool.post(url, "/generate", b"{}", {})
        await asyncio.sleep(0.2)
        assert [len(x) async for x in answer.lines()] == [len(line) - 1] * 600
        assert answer.reusable

    asyncio.run(serve(floods, slow))
