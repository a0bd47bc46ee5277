"""The bounded request head, on a real uvicorn server over real sockets: an endless header or
URL gets a 431 and a closed connection, while heads under the bound, bodies of any size in
the same reads and pipelined requests are served as before."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from radixcluster.router.api.http_protocol import MAX_HEAD_BYTES, BoundedHeadProtocol

TIMEOUT_S = 30


async def body_length(scope, receive, send) -> None:
    """Answers each request with the length of its body."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(body_length, http=BoundedHeadProtocol, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield listener.getsockname()
    server.should_exit = True
    thread.join(TIMEOUT_S)


def exchange(address: tuple[str, int], pieces: list[bytes]) -> bytes:
    """Sends ``pieces`` one by one and reads until the server ends the connection."""
    with socket.create_connection(address, timeout=TIMEOUT_S) as conn:
        try:
            for piece in pieces:
                conn.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-head: the answer is already on its way
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def get(header: bytes = b"", last: bool = True) -> bytes:
    """A request; the server closes the connection after answering the ``last`` one."""
    return b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if last else b"") + header + b"\r\n"


def post(body: bytes, last: bool = True) -> bytes:
    close = b"Connection: close\r\n" if last else b""
    return (
        b"POST / HTTP/1.1\r\nHost: x\r\n" + close + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def test_a_small_request_is_served(address) -> None:
    assert exchange(address, [post(b"hello")]).startswith(b"HTTP/1.1 200")


def test_an_endless_header_gets_a_431_and_the_connection_closes(address) -> None:
    # sent in small reads, as a slow client would: each read of it counts
    pieces = [get().removesuffix(b"\r\n") + b"X-Big: "] + [b"a" * 4096] * (4 * MAX_HEAD_BYTES // 4096)
    answer = exchange(address, pieces)
    assert answer.startswith(b"HTTP/1.1 431 ")
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == 431 and str(MAX_HEAD_BYTES) in body["error"]["message"]
    assert exchange(address, [get()]).startswith(b"HTTP/1.1 200")


def test_an_endless_url_gets_a_431(address) -> None:
    assert exchange(address, [b"GET /" + b"a" * (2 * MAX_HEAD_BYTES)]).startswith(b"HTTP/1.1 431 ")


def test_a_head_under_the_bound_is_served(address) -> None:
    header = b"X-Big: " + b"a" * (MAX_HEAD_BYTES - 1024) + b"\r\n"
    assert exchange(address, [get(header=header)]).startswith(b"HTTP/1.1 200")


def test_bodies_and_pipelined_requests_do_not_count_as_head(address) -> None:
    # one write: a body four times the bound, then a second request whose head is cut short
    # and finished in a later read
    second = get(header=b"X-Small: " + b"a" * 1000 + b"\r\n")
    answer = exchange(address, [post(b"b" * (4 * MAX_HEAD_BYTES), last=False) + second[:20], second[20:]])
    assert answer.count(b"HTTP/1.1 200") == 2 and str(4 * MAX_HEAD_BYTES).encode() in answer
